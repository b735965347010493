"""Speculative decoding in the scheduler and KV cache, with a drafting test executor.

Drafts are partly wrong; the deterministic executor checks the KV of every computed
position before each step, so KV left from a rejected draft token, or a prefix-cache block
holding one, fails the run. Outputs must equal those of the same workload without drafts.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine.spec_decode import NgramProposer, ngram_propose, num_accepted, verified
from slotune.engine.stretch.planner import untested_config
from tests.engine.deterministic import DraftingExecutor, token_for
from tests.engine.invariants import check_all, check_drained
from tests.engine.test_properties import ALL_CONFIGS, Workload, run, workloads


def brute_force_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The longest suffix of min_n..max_n tokens that recurs earlier, at its earliest place."""
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        starts = [i for i in range(len(tokens) - n) if tokens[i : i + n] == suffix]
        if starts:
            return tokens[starts[0] + n : starts[0] + n + k]
    return []


@given(
    st.lists(st.integers(0, 3), max_size=40),
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(0, 5),
)
def test_ngram_proposal_matches_brute_force(tokens: list[int], lo: int, extra: int, k: int) -> None:
    assert ngram_propose(tokens, lo, lo + extra, k) == brute_force_ngram(tokens, lo, lo + extra, k)


def test_ngram_proposal_examples() -> None:
    # the 2-gram [1, 2] recurs at 0 and 3: the earliest wins, longest n first
    assert ngram_propose([1, 2, 7, 1, 2, 8, 9, 1, 2], 1, 3, 2) == [7, 1]
    assert ngram_propose([5, 6, 7], 1, 3, 2) == []  # nothing recurs
    assert ngram_propose([4, 4, 4, 4], 2, 2, 5) == [4, 4]  # a match ending just before the suffix


def test_verification_keeps_the_accepted_prefix_and_one_more() -> None:
    assert num_accepted([3, 4, 5], [3, 4, 9, 1]) == 2
    assert verified([3, 4, 5], [3, 4, 9, 1]) == [3, 4, 9]
    assert verified([3, 4, 5], [3, 4, 5, 6]) == [3, 4, 5, 6]  # all accepted: the bonus token
    assert verified([3], [8, 6]) == [8]


def test_only_single_completions_without_top_logprobs_get_ngram_drafts() -> None:
    from slotune.engine.request import Request

    propose = NgramProposer(1, 2)
    prompt = [1, 2, 3, 1, 2]
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=5)):
        assert propose(Request("a", prompt, params), 2) == [3, 1]
    for params in (
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(temperature=0.0, n=2),
    ):
        assert propose(Request("b", prompt, params), 2) == []


@pytest.mark.parametrize(
    "fields",
    [
        dict(num_speculative_tokens=-1),
        dict(prompt_lookup_min=0),
        dict(prompt_lookup_min=4, prompt_lookup_max=3),
        dict(num_speculative_tokens=1.5),
        dict(speculative_model=""),
        dict(speculative_model=3),
        dict(speculative_acceptance=1.5),
        dict(speculative_acceptance=-0.1),
        dict(speculative_acceptance=True),
    ],
)
def test_bad_speculative_settings_are_refused(fields: dict) -> None:
    with pytest.raises(ValueError, match=f"EngineConfig.{next(iter(fields))}"):
        EngineConfig(**fields)


def test_the_stretch_planner_declines_speculation() -> None:
    assert untested_config(EngineConfig()) is None
    assert untested_config(EngineConfig(num_speculative_tokens=0, prompt_lookup_min=2)) is None
    assert "num_speculative_tokens=3" in str(
        untested_config(EngineConfig(num_speculative_tokens=3))
    )


def test_drafts_count_against_the_budget_and_rejected_slots_are_rolled_back() -> None:
    config = EngineConfig(
        max_num_batched_tokens=10,
        block_size=2,
        max_model_len=128,
        num_speculative_tokens=5,
        prefix_caching="hash",
    )
    executor = DraftingExecutor(num_gpu_blocks=200)
    engine = Engine(config, executor)
    rng = random.Random(3)
    prompts = {
        f"r{i}": [rng.randrange(2, 9) for _ in range(rng.randrange(3, 12))] for i in range(4)
    }
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    drafted_steps = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        so = executor.outputs[-1]
        check_all(engine, so)
        assert so.total_num_scheduled_tokens <= 10
        for rid, draft in so.spec_token_ids.items():
            assert so.num_scheduled_tokens[rid] == 1 + len(draft)
            drafted_steps += 1
        for req in engine.scheduler.running:  # no block past the verified tokens' KV
            held = len(engine.kv_cache.block_ids(req.request_id))
            assert held == -(-req.num_computed_tokens // 2)
            if req.output_token_ids:
                assert req.num_computed_tokens == req.num_tokens - 1
        for o in outputs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    check_drained(engine)
    stats = engine.stats()
    assert drafted_steps == stats["spec_num_drafts"] > 0
    assert 0 < stats["spec_num_accepted_tokens"] < stats["spec_num_draft_tokens"]
    per_pos = stats["spec_num_accepted_tokens_per_pos"]
    assert sum(per_pos) == stats["spec_num_accepted_tokens"]
    assert per_pos == sorted(per_pos, reverse=True)
    assert stats["steps"] < 4 * 30  # some steps took more than one token per request
    for rid, prompt in prompts.items():
        assert tokens[rid] == [token_for(rid, 0, len(prompt) + j) for j in range(30)]


@settings(max_examples=60, deadline=None)
@given(workloads(), st.sampled_from(ALL_CONFIGS), st.integers(1, 4))
def test_drafting_changes_no_output_and_keeps_invariants(
    w: Workload, cfg: tuple, num_spec: int
) -> None:
    """``run`` checks every step's invariants and KV, and every output against the tokens
    the executor samples, with tiny pools too (so drafts meet preemption and swapping)."""
    _, engine = run(w, *cfg, num_speculative_tokens=num_spec)
    tiny = replace(w, extra_blocks=0)
    run(tiny, *cfg, num_speculative_tokens=num_spec)
    stats = engine.stats()
    assert stats["spec_num_accepted_tokens"] <= stats["spec_num_draft_tokens"]
