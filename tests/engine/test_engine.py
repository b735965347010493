"""The Engine's public surface: requests in, tokens out, bad input rejected up front."""

from __future__ import annotations

import pytest

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine.executor import KVCacheCapacity
from tests.engine.deterministic import DeterministicExecutor, token_for
from tests.engine.invariants import check_all, check_drained

IGNORE = SamplingParams(max_tokens=4, ignore_eos=True)


def make(num_gpu_blocks: int = 256, num_cpu_blocks: int = 0, **kwargs) -> Engine:
    config = EngineConfig(**{"block_size": 4, "max_model_len": 128, **kwargs})
    return Engine(config, DeterministicExecutor(num_gpu_blocks, num_cpu_blocks))


def drain(engine: Engine) -> dict[tuple[str, int], list]:
    outs: dict[tuple[str, int], list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs.setdefault((out.request_id, out.index), []).append(out)
        check_all(engine, engine.executor.outputs[-1] if engine.executor.outputs else None)
    check_drained(engine)
    return outs


def tokens(outs: list) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rid", "prompt", "params", "message"),
    [
        ("", [1], None, "non-empty string"),
        ("x", [], None, "empty prompt"),
        ("x", [1, -2], None, "non-negative integers"),
        ("x", [1, "a"], None, "non-negative integers"),
        ("x", [1] * 129, None, "exceeds max_model_len=128"),
        ("x", [1], SamplingParams(n=9), "exceeds max_num_seqs=8"),
        ("x", [1], {"max_tokens": 3}, "must be SamplingParams"),
    ],
)
def test_add_request_rejects_bad_input(rid, prompt, params, message) -> None:
    engine = make(max_num_seqs=8)
    with pytest.raises(ValueError, match=message):
        engine.add_request(rid, prompt, params)
    assert not engine.has_unfinished_requests()


def test_prompt_that_can_never_fit_the_pool_is_rejected() -> None:
    engine = make(num_gpu_blocks=3)
    with pytest.raises(ValueError, match=r"needs 4 KV blocks but the pool has only 3"):
        engine.add_request("x", [1] * 13)
    engine.add_request("y", [1] * 12, IGNORE)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
    ],
)
def test_sampling_params_are_validated(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


def test_duplicate_ids_are_rejected_while_active_and_after_finishing() -> None:
    engine = make()
    engine.add_request("a", [1, 2], IGNORE)
    with pytest.raises(ValueError, match="already used"):
        engine.add_request("a", [3], IGNORE)
    drain(engine)
    with pytest.raises(ValueError, match="already used"):
        engine.add_request("a", [3], IGNORE)
    engine.add_request("b", [1], SamplingParams(n=2))
    with pytest.raises(ValueError, match="already used"):
        engine.add_request("b#1", [1])


def test_abort_of_unknown_or_finished_requests_is_a_no_op() -> None:
    engine = make()
    engine.abort_request("nobody")
    engine.add_request("a", [1, 2], IGNORE)
    drain(engine)
    engine.abort_request("a")
    assert engine.stats()["num_free_blocks"] == 256


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_abort_frees_running_waiting_and_swapped_requests(mode: str) -> None:
    engine = make(num_gpu_blocks=6, num_cpu_blocks=16, preemption_mode=mode, max_num_seqs=4)
    for i in range(4):
        engine.add_request(f"r{i}", [i + 2] * 6, SamplingParams(max_tokens=12, ignore_eos=True))
    for _ in range(6):
        engine.step()
        check_all(engine, None)
    assert engine.stats()["num_preemptions"] > 0
    if mode == "swap":
        assert engine.kv_cache.swapped
    for i in range(4):
        engine.abort_request(f"r{i}")
        check_all(engine, None)
    check_drained(engine)
    assert engine.step() == []
    assert engine.executor.outputs[-1].finished_request_ids <= {f"r{i}" for i in range(4)}


# -- results -------------------------------------------------------------------------------


def test_tokens_follow_the_executor_and_finish_with_length() -> None:
    engine = make()
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=5, ignore_eos=True))
    outs = drain(engine)[("a", 0)]
    assert tokens(outs) == [token_for("a", 0, 3 + k) for k in range(5)]
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].finish_reason == "length" and outs[-1].num_prompt_tokens == 3


def test_eos_and_stop_tokens_stop_unless_eos_is_ignored() -> None:
    prompt = [5, 6, 7]
    eos = token_for("a", 0, 5)  # the third generated token
    config = EngineConfig(block_size=4)
    engine = Engine(config, DeterministicExecutor(), eos_token_id=eos)
    engine.add_request("a", prompt, SamplingParams(max_tokens=10))
    engine.add_request("b", prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    stop = token_for("c", 0, 4)
    engine.add_request("c", prompt, SamplingParams(max_tokens=10, stop_token_ids=(stop,)))
    outs = drain(engine)
    assert len(tokens(outs[("a", 0)])) == 3 and outs[("a", 0)][-1].finish_reason == "stop"
    assert len(tokens(outs[("b", 0)])) == 10
    assert tokens(outs[("c", 0)])[-1] == stop and outs[("c", 0)][-1].finish_reason == "stop"


def test_extra_eos_tokens_stop_too() -> None:
    eos2 = token_for("a", 0, 4)  # the second generated token
    engine = Engine(
        EngineConfig(block_size=4),
        DeterministicExecutor(),
        eos_token_id=1,
        extra_eos_token_ids=[1, eos2],
    )
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=10))
    engine.add_request("b", [5, 6, 7], SamplingParams(max_tokens=10, ignore_eos=True))
    outs = drain(engine)
    assert len(tokens(outs[("a", 0)])) == 2 and outs[("a", 0)][-1].finish_reason == "stop"
    assert len(tokens(outs[("b", 0)])) == 10


def test_generation_stops_at_max_model_len() -> None:
    engine = make(max_model_len=16)
    engine.add_request("a", [1] * 10, SamplingParams(max_tokens=100, ignore_eos=True))
    engine.add_request("b", [1] * 16, SamplingParams(max_tokens=100, ignore_eos=True))
    outs = drain(engine)
    assert len(tokens(outs[("a", 0)])) == 6 and outs[("a", 0)][-1].finish_reason == "length"
    assert len(tokens(outs[("b", 0)])) == 1


def test_n_completions_share_the_prompt_and_report_parent_id_and_index() -> None:
    engine = make(max_num_seqs=4)
    engine.add_request("a", list(range(2, 9)), SamplingParams(max_tokens=6, n=3, ignore_eos=True))
    outs = drain(engine)
    assert sorted(outs) == [("a", 0), ("a", 1), ("a", 2)]
    for i in range(3):
        assert tokens(outs[("a", i)]) == [token_for("a", i, 7 + k) for k in range(6)]
    prefills = [so for so in engine.executor.outputs if so.num_prefill_tokens]
    assert len(prefills) == 1 and prefills[0].num_samples == {"a": 3}
    assert engine.stats()["num_copy_on_write"] == 2  # 7 tokens: block 1 is partial


def test_a_request_and_its_forks_keep_their_own_token_lists() -> None:
    """A request's token list is its prompt list until it is seated (``new_request`` keeps
    the caller's list); forks, preemptions and cached prefixes must leave every prompt as
    given and every token list its own."""
    engine = make(num_gpu_blocks=12, max_num_seqs=4, prefix_caching="hash")
    prompts = {rid: [7, 7, 7, 7, *range(2, 2 + n)] for rid, n in (("a", 5), ("b", 9), ("c", 3))}
    given = {rid: list(p) for rid, p in prompts.items()}
    engine.add_request("a", prompts["a"], SamplingParams(max_tokens=8, n=2, ignore_eos=True))
    engine.add_request("b", prompts["b"], SamplingParams(max_tokens=12, ignore_eos=True))
    engine.add_request("c", prompts["c"], SamplingParams(max_tokens=6, ignore_eos=True))
    requests = dict(engine.scheduler.requests)
    outs = drain(engine)
    assert engine.stats()["num_preemptions"] > 0  # 12 blocks of 4 cannot hold all four
    assert prompts == given
    for rid in prompts:
        assert requests[rid].all_token_ids == given[rid] + tokens(outs[(rid, 0)])


def test_request_that_outgrows_the_whole_pool_finishes_with_length() -> None:
    engine = make(num_gpu_blocks=2)  # 8 slots
    engine.add_request("a", [1] * 6, SamplingParams(max_tokens=20, ignore_eos=True))
    outs = drain(engine)[("a", 0)]
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert len(tokens(outs)) == 3  # tokens 7 and 8 fill the pool; the 9th has no slot


# -- scheduling ----------------------------------------------------------------------------


def test_chunked_prefill_splits_long_prompts_and_mixes_in_decodes() -> None:
    engine = make(max_num_batched_tokens=16, long_prefill_token_threshold=8)
    engine.add_request("short", [1, 2], IGNORE)
    engine.step()
    engine.add_request("long", [3] * 30, IGNORE)
    engine.step()
    so = engine.executor.outputs[-1]
    assert so.num_scheduled_tokens == {"short": 1, "long": 8}
    assert engine.last_step.num_prefill_tokens == 8 and engine.last_step.num_decode_tokens == 1
    drain(engine)
    chunks = [so.num_scheduled_tokens.get("long") for so in engine.executor.outputs]
    assert [c for c in chunks if c and c > 1] == [8, 8, 8, 6]


def test_prefill_first_never_splits_and_never_mixes() -> None:
    engine = make(policy="prefill_first", max_num_batched_tokens=128)
    engine.add_request("short", [1, 2], IGNORE)
    engine.step()
    engine.add_request("long", [3] * 100, IGNORE)
    engine.step()
    assert engine.executor.outputs[-1].num_scheduled_tokens == {"long": 100}
    engine.step()
    assert engine.executor.outputs[-1].num_scheduled_tokens == {"short": 1, "long": 1}
    drain(engine)


def test_preemption_takes_the_latest_arrival_and_swap_lists_copies() -> None:
    engine = make(num_gpu_blocks=5, num_cpu_blocks=8, preemption_mode="swap", max_num_seqs=4)
    for i in range(3):
        engine.add_request(f"r{i}", [i + 2] * 4, SamplingParams(max_tokens=8, ignore_eos=True))
    swapped = None
    while engine.has_unfinished_requests():
        engine.step()
        so = engine.executor.outputs[-1]
        if so.preempted_request_ids and swapped is None:
            swapped = so
    assert swapped is not None and swapped.preempted_request_ids[0] == "r2"
    assert len(swapped.swap_out) == 1  # r2 held one full block; its 5th token needs a 2nd
    resumed = [so for so in engine.executor.outputs if so.swap_in]
    assert resumed and "r2" in resumed[0].resumed_request_ids
    assert {c for _, c in swapped.swap_out} <= {c for c, _ in resumed[0].swap_in}
    assert engine.stats()["num_swap_outs"] >= 1
    check_drained(engine)


def test_finished_ids_reach_the_executor_in_the_next_step() -> None:
    engine = make()
    engine.add_request("a", [1], SamplingParams(max_tokens=1, ignore_eos=True))
    engine.add_request("b", [1], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.executor.outputs[-1].finished_request_ids == {"a"}


def test_capacity_comes_from_the_executor_unless_overridden() -> None:
    executor = DeterministicExecutor(num_gpu_blocks=100, num_cpu_blocks=7)
    seen: list[KVCacheCapacity] = []
    executor.initialize_cache = lambda config, cap: seen.append(cap)  # type: ignore[method-assign]
    Engine(EngineConfig(num_gpu_blocks=40, preemption_mode="swap"), executor)
    assert seen == [KVCacheCapacity(40, 7)]
    engine = Engine(EngineConfig(), DeterministicExecutor(num_gpu_blocks=100))
    assert engine.stats()["num_total_blocks"] == 100


def test_stats_and_last_step() -> None:
    engine = make()
    engine.add_request("a", [1] * 9, IGNORE)
    engine.step()
    step = engine.last_step
    assert step is not None and step.num_scheduled_tokens == 9 and step.num_prefill_tokens == 9
    assert step.kv_cache_usage == 3 / 256 and step.num_running == 1 and step.duration_s == 0.01
    drain(engine)
    stats = engine.stats()
    for key in (
        "num_total_blocks",
        "num_free_blocks",
        "num_preemptions",
        "num_swap_outs",
        "prefix_cache_queries_tokens",
        "prefix_cache_hit_tokens",
        "steps",
        "max_step_tokens",
    ):
        assert key in stats
    assert stats["steps"] == 4 and stats["max_step_tokens"] == 9
    assert stats["num_free_blocks"] == stats["num_total_blocks"] == 256


def _run_one(engine: Engine, rid: str, prompt: list[int]) -> tuple[int, list[int]]:
    """Serve one request to the end: its cached prompt tokens and its step sizes."""
    engine.add_request(rid, prompt, IGNORE)
    cached, steps = 0, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            cached = max(cached, out.num_cached_tokens)
        assert engine.last_step is not None
        steps.append(engine.last_step.num_scheduled_tokens)
    return cached, steps


@pytest.mark.parametrize("caching", ["hash", "radix"])
def test_a_reset_prefix_cache_serves_the_next_request_as_a_fresh_engine_does(
    caching: str,
) -> None:
    prompt = list(range(3, 3 + 21))
    config = EngineConfig(
        block_size=4, max_model_len=128, prefix_caching=caching, max_num_batched_tokens=8
    )
    # the stretch checker's shadow scheduler follows every step: its cache is reset too
    engine = Engine(config, DeterministicExecutor(256, 0), check_stretches=True)
    _run_one(engine, "a", prompt)
    assert _run_one(engine, "b", prompt)[0] == 20  # five full blocks of four hit
    engine.add_request("busy", prompt[:5], IGNORE)
    engine.step()
    assert not engine.reset_prefix_cache()  # a request holds blocks: nothing dropped
    drain(engine)
    assert engine.reset_prefix_cache()
    fresh = make(prefix_caching=caching, max_num_batched_tokens=8)
    cold = _run_one(fresh, "c", prompt)
    assert cold[0] == 0 and _run_one(engine, "c", prompt) == cold
    assert engine.stats()["num_free_blocks"] == engine.stats()["num_total_blocks"]
