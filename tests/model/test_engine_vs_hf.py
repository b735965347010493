"""The whole engine on the real model: greedy outputs equal transformers' generate, token for
token, however the scheduler splits, batches, caches, preempts or swaps the requests.

This is chunked prefill's promise, tested: splitting a prefill never changes the result.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slotune.engine import Engine, EngineConfig, SamplingParams

MAX_TOKENS = 10


def _prompts() -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(11)
    first = torch.randint(2, 512, (70,), generator=g).tolist()
    return {
        "first": first,
        "shares_prefix": first[:50] + torch.randint(2, 512, (17,), generator=g).tolist(),
        "short": torch.randint(2, 512, (5,), generator=g).tolist(),
        "medium": torch.randint(2, 512, (52,), generator=g).tolist(),
        "long": torch.randint(2, 512, (90,), generator=g).tolist(),
    }


PROMPTS = _prompts()


@pytest.fixture(
    scope="module",
    params=["tiny_dir", "qwen3_dir", "mixtral_dir", "qwen2_moe_dir", "qwen3_moe_dir"],
)
def model_dir(request: pytest.FixtureRequest) -> Path:
    """Each test runs on dense Llama and Qwen3 and on the three mixture-of-experts families."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def expected(model_dir: Path) -> dict[str, list[int]]:
    return hf_greedy(model_dir)


def hf_greedy(folder: Path) -> dict[str, list[int]]:
    """transformers' greedy continuation of every prompt, in float32."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    out = {}
    for rid, ids in PROMPTS.items():
        tokens = hf.eval().generate(
            torch.tensor([ids]),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        out[rid] = tokens[0, len(ids) :].tolist()
    return out


def generate(engine: Engine) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Run ``first`` alone to the end, then every other prompt at once."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    waves = [["first"], [rid for rid in PROMPTS if rid != "first"]]
    for wave in waves:
        for rid in wave:
            engine.add_request(rid, PROMPTS[rid], params)
        while engine.has_unfinished_requests():
            for o in engine.step():
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
                cached[o.request_id] = o.num_cached_tokens
    return tokens, cached


CONFIGS = {
    "chunked-bs16-budget16": dict(policy="chunked", block_size=16, max_num_batched_tokens=16),
    "chunked-bs32-budget24": dict(policy="chunked", block_size=32, max_num_batched_tokens=24),
    "chunked-bs16-threshold8": dict(
        policy="chunked", block_size=16, max_num_batched_tokens=40, long_prefill_token_threshold=8
    ),
    "chunked-bs32-radix": dict(
        policy="chunked", block_size=32, max_num_batched_tokens=32, prefix_caching="radix"
    ),
    "prefill_first-bs16": dict(policy="prefill_first", block_size=16, max_num_batched_tokens=128),
    "prefill_first-bs32": dict(policy="prefill_first", block_size=32, max_num_batched_tokens=128),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_generations_equal_transformers(
    model_dir: Path, expected: dict[str, list[int]], name: str
) -> None:
    config = EngineConfig(max_model_len=128, num_gpu_blocks=64, **CONFIGS[name])
    engine = Engine.local(config, model=str(model_dir), device="cpu", attention="torch")
    tokens, cached = generate(engine)
    assert tokens == expected
    assert cached["shares_prefix"] >= 32  # reused the first request's prefix blocks
    assert engine.stats()["max_step_tokens"] <= config.max_num_batched_tokens


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_preemption_by_a_tiny_pool_changes_nothing(
    model_dir: Path, expected: dict[str, list[int]], mode: str, block_size: int
) -> None:
    config = EngineConfig(
        max_model_len=128,
        block_size=block_size,
        max_num_batched_tokens=32,
        num_gpu_blocks=4 * 32 // block_size + 1,
        preemption_mode=mode,
        swap_space_gb=0.01,
    )
    engine = Engine.local(config, model=str(model_dir), device="cpu", attention="torch")
    tokens, _ = generate(engine)
    assert tokens == expected
    stats = engine.stats()
    assert stats["num_preemptions"] > 0
    if mode == "swap":
        assert stats["num_swap_outs"] > 0 and stats["num_swap_ins"] > 0


def _run_one(tiny_dir: Path, params: SamplingParams) -> dict[tuple[str, int], list[int]]:
    config = EngineConfig(max_model_len=128, max_num_batched_tokens=16, num_gpu_blocks=32)
    engine = Engine.local(config, model=str(tiny_dir), device="cpu", attention="torch")
    engine.add_request("r", PROMPTS["medium"], params)
    out: dict[tuple[str, int], list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault((o.request_id, o.index), []).extend(o.new_token_ids)
    return out


def test_seeded_sampling_with_n_completions_is_reproducible(tiny_dir: Path) -> None:
    params = SamplingParams(n=2, temperature=1.0, top_p=0.9, seed=5, max_tokens=8, ignore_eos=True)
    first, second = _run_one(tiny_dir, params), _run_one(tiny_dir, params)
    assert first == second
    assert sorted(first) == [("r", 0), ("r", 1)]
    assert first[("r", 0)] != first[("r", 1)]


def test_a_stop_token_ends_the_generation(model_dir: Path, expected: dict[str, list[int]]) -> None:
    want = expected["medium"]
    stop = want[3] if want[3] not in want[:3] else want[0]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=(stop,))
    [tokens] = _run_one(model_dir, params).values()
    assert tokens == want[: want.index(stop) + 1]
