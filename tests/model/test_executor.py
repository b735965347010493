"""TorchExecutor on hand-built scheduler outputs: chunks, swaps and copy-on-write."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slotune.engine.config import EngineConfig
from slotune.engine.executor import KVCacheCapacity
from slotune.engine.model import TorchExecutor
from slotune.engine.request import Request
from slotune.engine.sampling_params import SamplingParams
from slotune.engine.scheduler_output import SchedulerOutput
from tests.model.test_llama_vs_hf import hf_logits, prompt

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def step(ex: TorchExecutor, scheduled: dict[Request, tuple[int, list[int]]], **copies):
    so = SchedulerOutput(
        requests={r.request_id: r for r in scheduled},
        num_scheduled_tokens={r.request_id: n for r, (n, _) in scheduled.items()},
        total_num_scheduled_tokens=sum(n for n, _ in scheduled.values()),
        block_tables={r.request_id: t for r, (_, t) in scheduled.items()},
        **copies,
    )
    out = ex.execute(so)
    assert out.duration_s > 0
    for r, (n, _) in scheduled.items():
        r.num_computed_tokens += n
    return out


@pytest.fixture(scope="module")
def executor(tiny_dir: Path) -> TorchExecutor:
    ex = TorchExecutor(tiny_dir, device="cpu", attention="torch")
    config = EngineConfig(block_size=16)
    capacity = ex.determine_capacity(config)
    assert capacity.num_gpu_blocks > 100 and capacity.num_cpu_blocks > 100
    ex.initialize_cache(config, KVCacheCapacity(num_gpu_blocks=16, num_cpu_blocks=4))
    return ex


def test_swap_out_swap_in_and_copy_on_write_keep_the_context(
    executor: TorchExecutor, tiny_dir: Path
) -> None:
    ids = prompt(40, 5)
    a = Request("a", ids, GREEDY)
    assert step(executor, {a: (25, [3, 9])}).sampled_token_ids == {}

    step(executor, {}, swap_out=[(3, 0), (9, 1)])
    for cache in executor._kv:
        cache[:, [3, 9]] = 99.0
    out = step(executor, {a: (15, [5, 6, 7])}, swap_in=[(0, 5), (1, 6)])
    ref = hf_logits(tiny_dir, ids)[-1]
    token = int(ref.argmax())
    assert out.sampled_token_ids == {"a": [token]}
    assert out.logprobs["a"][0] == pytest.approx(torch.log_softmax(ref, -1)[token].item(), abs=1e-4)
    a.append_output_token(token)

    b = Request("a#1", ids, GREEDY, index=1)
    b.num_computed_tokens = 40
    b.append_output_token(token)
    out = step(executor, {a: (1, [5, 6, 7]), b: (1, [5, 6, 8])}, copy_on_write=[(7, 8)])
    want = int(hf_logits(tiny_dir, [*ids, token])[-1].argmax())
    assert out.sampled_token_ids == {"a": [want], "a#1": [want]}


def test_num_samples_draws_n_tokens_at_the_end_of_the_prompt(executor: TorchExecutor) -> None:
    r = Request("n", prompt(10, 6), SamplingParams(n=3, seed=1))
    so = SchedulerOutput(
        requests={"n": r},
        num_scheduled_tokens={"n": 10},
        total_num_scheduled_tokens=10,
        block_tables={"n": [11]},
        num_samples={"n": 3},
    )
    assert len(executor.execute(so).sampled_token_ids["n"]) == 3


def test_eos_token_id_comes_from_the_checkpoint(executor: TorchExecutor) -> None:
    assert executor.eos_token_id is not None
    assert executor.tokenizer is not None
    assert executor.tokenizer.id_to_token(executor.eos_token_id) == "<|end_of_text|>"


def test_bfloat16_weights_run_on_the_cpu(tiny_dir: Path) -> None:
    ids = prompt(30, 8)
    tokens = []
    for dtype in ("float32", "bfloat16"):
        ex = TorchExecutor(tiny_dir, device="cpu", attention="torch", dtype=dtype)
        ex.initialize_cache(EngineConfig(), KVCacheCapacity(num_gpu_blocks=4, num_cpu_blocks=0))
        out = step(ex, {Request("a", ids, GREEDY): (30, [0, 1])})
        tokens.append(out.sampled_token_ids["a"])
    assert ex.dtype == torch.bfloat16
    assert tokens[0] == tokens[1]


def test_a_token_outside_the_vocabulary_is_rejected_by_name(executor: TorchExecutor) -> None:
    with pytest.raises(ValueError, match=r"'bad': token id 9999 is outside"):
        step(executor, {Request("bad", [5, 9999, 7], GREEDY): (3, [12])})
    with pytest.raises(ValueError, match="attention 'fast' is unknown"):
        TorchExecutor("unused", attention="fast")
