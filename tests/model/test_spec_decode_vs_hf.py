"""N-gram speculative decoding on the real model: greedy outputs equal transformers'
generate token for token, and the engine's own without speculation, whatever the budget,
block size, cache or preemption; rejected drafts leave no KV behind (a later request that
reuses the drafted request's blocks through the prefix cache still matches transformers).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slotune.engine import Engine, EngineConfig, SamplingParams

MAX_TOKENS = 40


def _prompts() -> dict[str, list[int]]:
    """Prompts with repeats, so that prompt lookup finds something to draft."""
    g = torch.Generator().manual_seed(12)

    def rand(n: int) -> list[int]:
        return torch.randint(2, 512, (n,), generator=g).tolist()

    a, b = rand(30), rand(20)
    return {
        "first": a + b + a[:10],
        "short": rand(6),
        "repeats": (rand(8) * 4)[:29],
        "long": rand(40) + a[:20] + rand(10),
    }


PROMPTS = _prompts()


@pytest.fixture(
    scope="module",
    params=[
        "tiny_dir",
        pytest.param("qwen3_dir", marks=pytest.mark.slow),
        pytest.param("mixtral_dir", marks=pytest.mark.slow),
    ],
)
def model_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


def greedy_prompts_and_expected(
    hf: torch.nn.Module,
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Every prompt and ``hf``'s greedy continuation, plus ``continues``: the first prompt
    and most of its continuation, which the engine can take from the prefix cache."""

    def greedy(ids: list[int]) -> list[int]:
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        return out[0, len(ids) :].tolist()

    prompts = dict(PROMPTS)
    expected = {rid: greedy(ids) for rid, ids in prompts.items()}
    prompts["continues"] = prompts["first"] + expected["first"][:35]
    expected["continues"] = greedy(prompts["continues"])
    return prompts, expected


@pytest.fixture(scope="module")
def prompts_and_expected(model_dir: Path) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """transformers' greedy continuations (``greedy_prompts_and_expected``)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    return greedy_prompts_and_expected(hf.eval())


def generate(engine: Engine, prompts: dict[str, list[int]]) -> tuple[dict, dict]:
    """``first`` alone to the end, then all the others at once."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    for wave in (["first"], [rid for rid in prompts if rid != "first"]):
        for rid in wave:
            engine.add_request(rid, prompts[rid], params)
        while engine.has_unfinished_requests():
            for o in engine.step():
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
                cached[o.request_id] = o.num_cached_tokens
    return tokens, cached


CONFIGS = {
    "k3-bs16-budget16-hash": dict(
        block_size=16, max_num_batched_tokens=16, num_speculative_tokens=3
    ),
    "k5-bs32-budget64-radix": dict(
        block_size=32, max_num_batched_tokens=64, prefix_caching="radix", num_speculative_tokens=5
    ),
    "k2-prefill_first-bs16": dict(
        policy="prefill_first", block_size=16, max_num_batched_tokens=256, num_speculative_tokens=2
    ),
    "k4-bs16-tiny-pool-recompute": dict(
        block_size=16, max_num_batched_tokens=32, num_gpu_blocks=11, num_speculative_tokens=4
    ),
    "k4-bs16-tiny-pool-swap": dict(
        block_size=16,
        max_num_batched_tokens=32,
        num_gpu_blocks=11,
        preemption_mode="swap",
        swap_space_gb=0.01,
        num_speculative_tokens=4,
    ),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_speculative_greedy_equals_transformers(
    model_dir: Path, prompts_and_expected: tuple[dict, dict], name: str
) -> None:
    prompts, expected = prompts_and_expected
    fields = dict(max_model_len=256, num_gpu_blocks=64, prompt_lookup_min=1, prompt_lookup_max=3)
    config = EngineConfig(**(fields | CONFIGS[name]))
    engine = Engine.local(config, model=str(model_dir), device="cpu", attention="torch")
    tokens, cached = generate(engine, prompts)
    assert tokens == expected
    stats = engine.stats()
    assert stats["max_step_tokens"] <= config.max_num_batched_tokens
    assert 0 < stats["spec_num_accepted_tokens"] < stats["spec_num_draft_tokens"]
    if "tiny-pool" in name:
        assert stats["num_preemptions"] > 0
    else:  # reused blocks that speculative steps computed, past the first prompt
        assert cached["continues"] > len(prompts["first"])


def test_speculation_off_and_on_agree_and_on_takes_fewer_steps(tiny_dir: Path) -> None:
    prompts = dict(PROMPTS)
    runs = {}
    for k in (0, 4):
        config = EngineConfig(
            max_model_len=256,
            num_gpu_blocks=64,
            max_num_batched_tokens=64,
            num_speculative_tokens=k,
            prompt_lookup_min=1,
            prompt_lookup_max=3,
        )
        engine = Engine.local(config, model=str(tiny_dir), device="cpu", attention="torch")
        runs[k] = generate(engine, prompts)[0], engine.stats()["steps"]
    assert runs[4][0] == runs[0][0]
    assert runs[4][1] < runs[0][1]
