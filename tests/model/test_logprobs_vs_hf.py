"""Logprobs and top-k alternatives from the engine equal transformers' log-softmax of the
same checkpoint's logits, token by token, for greedy, sampled and forked (n > 1) requests
sharing a batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slotune.engine import Engine, EngineConfig, SamplingParams
from tests.model.test_llama_vs_hf import hf_logits, prompt

CONFIG = EngineConfig(block_size=16, max_num_batched_tokens=64, max_num_seqs=8)
REQUESTS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=5),
    "sampled": SamplingParams(temperature=1.3, seed=7, max_tokens=6, ignore_eos=True, logprobs=3),
    "forked": SamplingParams(n=2, seed=1, max_tokens=4, ignore_eos=True, logprobs=20),
    "plain": SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
}
PROMPTS = {rid: prompt(20 + 9 * i, seed=i) for i, rid in enumerate(REQUESTS)}


@pytest.fixture(scope="module")
def outputs(tiny_dir: Path) -> dict[tuple[str, int], list]:
    """(request id, completion index) -> its outputs, all requests run in one batch."""
    engine = Engine.local(CONFIG, model=str(tiny_dir), device="cpu")
    for rid, params in REQUESTS.items():
        engine.add_request(rid, PROMPTS[rid], params)
    found: dict[tuple[str, int], list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.new_token_ids:
                found.setdefault((out.request_id, out.index), []).append(out)
    return found


@pytest.mark.parametrize(
    "key", [("greedy", 0), ("sampled", 0), ("forked", 0), ("forked", 1), ("plain", 0)]
)
def test_logprobs_and_top_k_match_transformers(
    outputs: dict[tuple[str, int], list], tiny_dir: Path, key: tuple[str, int]
) -> None:
    rid, _ = key
    k = REQUESTS[rid].logprobs
    tokens = [t for out in outputs[key] for t in out.new_token_ids]
    assert len(tokens) == REQUESTS[rid].max_tokens
    ids = PROMPTS[rid]
    reference = torch.log_softmax(hf_logits(tiny_dir, ids + tokens)[len(ids) - 1 : -1], -1)
    for out, ref in zip(outputs[key], reference, strict=True):
        (token,) = out.new_token_ids
        assert out.logprobs[0] == pytest.approx(ref[token].item(), abs=1e-4)
        if k == 0:
            assert out.top_logprobs == ()
            continue
        (top,) = out.top_logprobs
        values, expected_ids = torch.topk(ref, k)
        assert list(top) == expected_ids.tolist()  # most likely first
        assert list(top.values()) == pytest.approx(values.tolist(), abs=1e-4)
    if rid == "greedy":
        assert all(next(iter(o.top_logprobs[0])) == o.new_token_ids[0] for o in outputs[key])
