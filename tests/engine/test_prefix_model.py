"""Hash and radix prefix caches against a brute-force model of which prefixes are cached.

Requests run one after another in a pool large enough that nothing is evicted, so the
model is simply every block-aligned prefix whose KV some earlier request computed. A new
prompt's hit must be the longest such prefix, capped so its last token is computed.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotune.engine import Engine, EngineConfig, SamplingParams
from tests.engine.deterministic import DeterministicExecutor
from tests.engine.invariants import check_all


def expected_hit(cached: set[tuple[int, ...]], prompt: list[int], block_size: int) -> int:
    best = 0
    for k in range(1, (len(prompt) - 1) // block_size + 1):
        if tuple(prompt[: k * block_size]) in cached:
            best = k * block_size
    return best


prompts = st.lists(
    st.lists(st.integers(2, 3), min_size=1, max_size=20),
    min_size=1,
    max_size=12,
)


def run_sequentially(kind: str, block_size: int, plist: list[list[int]], max_tokens: int) -> None:
    config = EngineConfig(block_size=block_size, prefix_caching=kind, max_model_len=64)  # type: ignore[arg-type]
    engine = Engine(config, DeterministicExecutor(num_gpu_blocks=4096))
    cached: set[tuple[int, ...]] = set()
    for i, prompt in enumerate(plist):
        rid = f"q{i}"
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        tokens = list(prompt)
        first = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                first = out if first is None else first
                tokens.extend(out.new_token_ids)
            check_all(engine, None)
        assert first is not None
        assert first.num_cached_tokens == expected_hit(cached, prompt, block_size), (kind, i)
        computed = len(tokens) - 1  # the last sampled token's KV is never computed
        cached.update(tuple(tokens[: k * block_size]) for k in range(1, computed // block_size + 1))
    stats = engine.stats()
    assert stats["prefix_cache_queries_tokens"] == sum(len(p) for p in plist)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(prompts, st.sampled_from((1, 2, 4)), st.integers(1, 6))
def test_hash_and_radix_hits_match_the_model(plist, block_size, max_tokens) -> None:
    for kind in ("hash", "radix"):
        run_sequentially(kind, block_size, plist, max_tokens)


def test_full_hit_still_computes_the_last_prompt_token() -> None:
    config = EngineConfig(block_size=4, prefix_caching="hash")
    executor = DeterministicExecutor()
    engine = Engine(config, executor)
    prompt = list(range(2, 10))  # two full blocks
    for rid in ("a", "b"):
        engine.add_request(rid, prompt, SamplingParams(max_tokens=1, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
    last = executor.outputs[-1]
    assert last.num_scheduled_tokens == {"b": 4}  # hit 4 of 8: the second block holds token 8
    assert engine.stats()["prefix_cache_hit_tokens"] == 4


class ModelCheckingExecutor(DeterministicExecutor):
    """Keeps the brute-force model (every block-aligned prefix whose KV any earlier step
    computed) and checks each newly admitted request's hit against it."""

    def __init__(self) -> None:
        super().__init__(num_gpu_blocks=8192)
        self.cached: set[tuple[int, ...]] = set()
        self.checked = 0

    def execute(self, so):  # type: ignore[no-untyped-def]
        bs = self.block_size
        for rid in so.new_request_ids:
            req = so.requests[rid]
            assert req.num_computed_tokens == expected_hit(self.cached, req.all_token_ids, bs)
            self.checked += 1
        result = super().execute(so)
        for rid, n in so.num_scheduled_tokens.items():
            req = so.requests[rid]
            done = req.num_computed_tokens + n
            toks = req.all_token_ids
            self.cached.update(tuple(toks[: k * bs]) for k in range(1, done // bs + 1))
        return result


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    prompts,
    st.sampled_from((1, 2, 4)),
    st.lists(st.integers(0, 4), min_size=12, max_size=12),
    st.integers(4, 40),
)
def test_hits_match_the_model_with_concurrent_requests(plist, block_size, gaps, budget) -> None:
    for kind in ("hash", "radix"):
        config = EngineConfig(
            block_size=block_size,
            prefix_caching=kind,  # type: ignore[arg-type]
            max_model_len=64,
            max_num_batched_tokens=budget,
        )
        executor = ModelCheckingExecutor()
        engine = Engine(config, executor)
        pending = list(enumerate(plist))
        while pending or engine.has_unfinished_requests():
            for _ in range(gaps[len(pending) % len(gaps)] if pending else 0):
                if engine.has_unfinished_requests():
                    engine.step()
            if pending:
                i, prompt = pending.pop(0)
                params = SamplingParams(max_tokens=1 + i % 5, n=1 + i % 2, ignore_eos=True)
                engine.add_request(f"q{i}", prompt, params)
            engine.step()
            check_all(engine, None)
        assert executor.checked == len(plist)
