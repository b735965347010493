"""Draft-model speculative decoding on the real model.

The draft is the target's first layer alone (same embeddings, head and vocabulary), so it
is right often and wrong often. Greedy outputs equal transformers' generate token for token
whatever the budget, block size, cache or preemption; the draft's own KV at every verified
position (prefix-cache hits and swapped-in blocks included) equals the keys and values
transformers computes for the draft on the verified tokens, so neither rejected tokens nor
another request's blocks leave wrong draft KV behind; no block outlives its request. With
the target as its own draft every draft token is accepted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slotune.engine import Engine, EngineConfig
from slotune.engine.model.draft import DraftModel
from tests.engine.invariants import check_drained
from tests.model.test_spec_decode_vs_hf import CONFIGS, generate, greedy_prompts_and_expected

DRAFT = dict(prompt_lookup_min=1, prompt_lookup_max=3)  # ignored with a draft model


@pytest.fixture(scope="module")
def draft_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target cut to its first decoder layer."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    hf.model.layers = hf.model.layers[:1]
    hf.config.num_hidden_layers = 1
    folder = tmp_path_factory.mktemp("draft")
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_models(tiny_dir: Path, draft_dir: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    def load(path: Path) -> torch.nn.Module:
        m = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        return m.eval()

    return load(tiny_dir), load(draft_dir)


@pytest.fixture(scope="module")
def prompts_and_expected(
    hf_models: tuple[torch.nn.Module, torch.nn.Module],
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    return greedy_prompts_and_expected(hf_models[0])


def _engine(target: Path, draft: Path, name: str) -> Engine:
    fields = dict(max_model_len=256, num_gpu_blocks=64, speculative_model=str(draft)) | DRAFT
    config = EngineConfig(**(fields | CONFIGS[name]))
    return Engine.local(config, model=str(target), device="cpu", attention="torch")


def _reference_kv(draft: torch.nn.Module, tokens: list[int]) -> list[tuple[torch.Tensor, ...]]:
    """transformers' draft keys and values of ``tokens``, per layer [tokens, heads, dim]."""
    with torch.no_grad():
        out = draft(torch.tensor([tokens]), use_cache=True)
    return [
        (lay.keys[0].transpose(0, 1), lay.values[0].transpose(0, 1))
        for lay in out.past_key_values.layers
    ]


def _check_draft_kv(engine: Engine, reference: torch.nn.Module) -> int:
    """Compare the draft's KV at every running request's verified positions; how many."""
    draft = engine.executor.propose_draft  # type: ignore[attr-defined]
    assert isinstance(draft, DraftModel) and draft.kv is not None
    bs = engine.config.block_size
    checked = 0
    for req in engine.scheduler.running:
        n = req.num_computed_tokens
        if n == 0:
            continue
        table = engine.kv_cache.block_tables[req.request_id]
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
        want = _reference_kv(reference, req.all_token_ids[:n])
        for layer, (keys, values) in enumerate(want):
            got_k = draft.kv[0][layer].flatten(0, 1)[slots]
            got_v = draft.kv[1][layer].flatten(0, 1)[slots]
            torch.testing.assert_close(got_k, keys, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(got_v, values, atol=1e-4, rtol=1e-4)
        checked += n
    return checked


@pytest.mark.parametrize("name", CONFIGS)
def test_draft_model_greedy_equals_transformers(
    tiny_dir: Path,
    draft_dir: Path,
    hf_models: tuple[torch.nn.Module, torch.nn.Module],
    prompts_and_expected: tuple[dict, dict],
    name: str,
) -> None:
    prompts, expected = prompts_and_expected
    engine = _engine(tiny_dir, draft_dir, name)
    checked = 0
    step = engine.step

    def checked_step() -> list:
        nonlocal checked
        outputs = step()
        checked += _check_draft_kv(engine, hf_models[1])
        bs = engine.config.block_size
        for req in engine.scheduler.running:  # rejected drafts' blocks rolled back
            if req.output_token_ids:
                held = len(engine.kv_cache.block_ids(req.request_id))
                assert held == max(-(-req.num_computed_tokens // bs), 1)
        return outputs

    engine.step = checked_step  # type: ignore[method-assign]
    tokens, cached = generate(engine, prompts)
    assert tokens == expected
    assert checked > 0
    check_drained(engine)
    stats = engine.stats()
    assert stats["max_step_tokens"] <= engine.config.max_num_batched_tokens
    assert 0 < stats["spec_num_accepted_tokens"] < stats["spec_num_draft_tokens"]
    if "tiny-pool" in name:
        assert stats["num_preemptions"] > 0
    else:  # reused blocks that speculative steps computed, past the first prompt
        assert cached["continues"] > len(prompts["first"])


@pytest.mark.parametrize("name", ["k5-bs32-budget64-radix", "k4-bs16-tiny-pool-swap"])
def test_the_target_as_its_own_draft_is_always_accepted(
    tiny_dir: Path, prompts_and_expected: tuple[dict, dict], name: str
) -> None:
    """Exact only if the draft's KV is the target's at every position it reads: after
    prefix-cache hits, swaps and recomputes too."""
    prompts, expected = prompts_and_expected
    engine = _engine(tiny_dir, tiny_dir, name)
    tokens, _ = generate(engine, prompts)
    assert tokens == expected
    stats = engine.stats()
    assert stats["spec_num_draft_tokens"] > 0
    assert stats["spec_num_accepted_tokens"] == stats["spec_num_draft_tokens"]
    if "swap" in name:
        assert stats["num_preemptions"] > 0


def test_draft_and_off_agree_and_the_draft_takes_fewer_steps(
    tiny_dir: Path, draft_dir: Path, prompts_and_expected: tuple[dict, dict]
) -> None:
    prompts, _ = prompts_and_expected
    runs = {}
    for k in (0, 4):
        config = EngineConfig(
            max_model_len=256,
            num_gpu_blocks=64,
            max_num_batched_tokens=64,
            num_speculative_tokens=k,
            speculative_model=str(draft_dir),
        )
        engine = Engine.local(config, model=str(tiny_dir), device="cpu", attention="torch")
        runs[k] = generate(engine, prompts)[0], engine.stats()["steps"]
    assert runs[4][0] == runs[0][0]
    assert runs[4][1] < runs[0][1]


def test_the_draft_counts_in_every_kv_block(tiny_dir: Path, draft_dir: Path) -> None:
    """Its cache shares the target's block ids: a block costs both models' bytes."""
    from slotune.engine.model import TorchExecutor

    ex = TorchExecutor(tiny_dir, device="cpu", attention="torch")
    target_only = ex.block_bytes(16)
    config = EngineConfig(num_speculative_tokens=2, speculative_model=str(draft_dir))
    ex.determine_capacity(config)
    assert ex.block_bytes(16) == target_only * 3 // 2  # one of two layers again


def test_a_draft_of_another_vocabulary_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    from tests.model.conftest import save_hf

    other = save_hf(tmp_path / "other", "llama", seed=9, vocab_size=600, num_hidden_layers=1)
    config = EngineConfig(num_speculative_tokens=2, speculative_model=str(other))
    with pytest.raises(ValueError, match="vocabulary of 600 tokens, the target's has 512"):
        Engine.local(config, model=str(tiny_dir), device="cpu", attention="torch")


def test_the_draft_runs_the_passes_the_simulator_prices(
    tiny_dir: Path, draft_dir: Path, prompts_and_expected: tuple[dict, dict]
) -> None:
    """Each step: a single-token pass per draft token of every verifying request, then one
    pass over exactly the target's scheduled tokens (``sim.speculative`` prices these)."""
    prompts, _ = prompts_and_expected
    engine = _engine(tiny_dir, draft_dir, "k3-bs16-budget16-hash")
    draft = engine.executor.propose_draft  # type: ignore[attr-defined]
    model, execute = draft.model, engine.executor.execute
    passes: list[int] = []
    outputs: list = []

    def counting(batch: object, *args: object) -> torch.Tensor:
        passes.append(int(batch.input_ids.numel()))  # type: ignore[attr-defined]
        return model(batch, *args)

    def recording(so: object) -> object:
        outputs.append(so)
        return execute(so)

    draft.model = counting
    engine.executor.execute = recording  # type: ignore[method-assign]
    step = engine.step
    checked = 0

    def checked_step() -> list:
        nonlocal checked
        passes.clear()
        result = step()
        so = outputs[-1]
        drafted = sum(len(d) for d in so.spec_token_ids.values())
        assert passes == [1] * drafted + [so.total_num_scheduled_tokens]
        checked += drafted
        return result

    engine.step = checked_step  # type: ignore[method-assign]
    generate(engine, prompts)
    assert checked > 0
