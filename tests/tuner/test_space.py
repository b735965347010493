"""The search space: conditionals give valid configs only; overrides fix and narrow."""

from __future__ import annotations

import json

import optuna
import pytest

from slotune.engine.config import EngineConfig
from slotune.targets import get_target
from slotune.tuner.space import (
    THRESHOLD_GATE,
    SearchSpace,
    SearchSpaceError,
    build_space,
    load_search_file,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def sample(space: SearchSpace, n: int, seed: int = 0) -> list[tuple[dict, EngineConfig]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        config = space.suggest(trial)
        out.append((dict(trial.params), config))
        study.tell(trial, 0.0)
    return out


def test_default_space_searches_the_seven_knobs() -> None:
    space = build_space(max_model_len=2048)
    assert set(space.free_names) == {
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
        "block_size",
        "preemption_mode",
        "max_num_seqs",
        "prefix_caching",
        "policy",
    }
    assert space.fixed == {"max_model_len": 2048}


def test_every_sampled_trial_is_a_valid_config_and_conditionals_hold() -> None:
    space = build_space(max_model_len=3000)
    seen_policies, seen_gate = set(), set()
    for params, config in sample(space, 300):
        seen_policies.add(config.policy)
        assert config.max_model_len == 3000
        assert config.max_num_batched_tokens % 128 == 0
        assert config.block_size in (8, 16, 32, 64, 128, 256)
        assert 8 <= config.max_num_seqs <= 1024
        if config.policy == "prefill_first":
            # the threshold is not even asked for, and the budget holds a whole prompt
            assert "long_prefill_token_threshold" not in params
            assert THRESHOLD_GATE not in params
            assert config.long_prefill_token_threshold == 0
            assert config.max_num_batched_tokens >= 3000
        else:
            seen_gate.add(params[THRESHOLD_GATE])
            if not params[THRESHOLD_GATE]:
                assert "long_prefill_token_threshold" not in params
                assert config.long_prefill_token_threshold == 0
            else:
                t = config.long_prefill_token_threshold
                assert t == 0 or 64 <= t < config.max_num_batched_tokens
    assert seen_policies == {"chunked", "prefill_first"}
    assert seen_gate == {True, False}


def test_threshold_at_or_above_the_budget_is_off() -> None:
    space = build_space(max_model_len=2048)
    config = space.config_from_params(
        {
            "policy": "chunked",
            "max_num_batched_tokens": 1024,
            THRESHOLD_GATE: True,
            "long_prefill_token_threshold": 4096,
            "block_size": 16,
            "max_num_seqs": 64,
            "preemption_mode": "recompute",
            "prefix_caching": "hash",
        }
    )
    assert config.long_prefill_token_threshold == 0


def test_prefill_first_is_dropped_when_no_budget_can_hold_a_prompt() -> None:
    space = build_space(
        max_model_len=8000, overrides={"max_num_batched_tokens": {"low": 256, "high": 4096}}
    )
    assert space.params["policy"].values == ("chunked",)
    with pytest.raises(SearchSpaceError, match="prefill_first"):
        build_space(
            max_model_len=8000,
            overrides={"max_num_batched_tokens": {"high": 4096}, "policy": "prefill_first"},
        )


def test_overrides_fix_narrow_and_choose() -> None:
    space = build_space(
        max_model_len=2048,
        overrides={
            "max_num_batched_tokens": {"low": 1000, "high": 5000},
            "block_size": 32,
            "prefix_caching": ["hash", "radix"],
            "long_prefill_token_threshold": "off",
            "gpu_memory_utilization": 0.8,
        },
    )
    budget = space.params["max_num_batched_tokens"]
    assert (budget.low, budget.high, budget.step, budget.log) == (1024, 4992, 128, True)
    assert space.params["block_size"].is_fixed
    assert space.fixed["gpu_memory_utilization"] == 0.8
    for params, config in sample(space, 60):
        assert 1024 <= config.max_num_batched_tokens <= 4992
        assert config.block_size == 32
        assert config.prefix_caching in ("hash", "radix")
        assert config.long_prefill_token_threshold == 0
        assert config.gpu_memory_utilization == 0.8
        assert "block_size" not in params


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch": 4}, "unknown parameter 'batch'"),
        ({"block_size": 24}, "not a power of two"),
        ({"policy": "fifo"}, "not one of"),
        ({"max_num_seqs": {"low": 64, "high": 8}}, "empty range"),
        ({"max_num_seqs": {"lo": 8}}, "unknown key"),
        ({"prefix_caching": []}, "empty list"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ],
)
def test_bad_overrides_name_the_problem(overrides: dict, message: str) -> None:
    with pytest.raises(SearchSpaceError, match=message):
        build_space(max_model_len=2048, overrides=overrides, where="s.yaml")


def test_empty_search_space_is_an_error() -> None:
    everything_fixed = {
        "max_num_batched_tokens": 2048,
        "long_prefill_token_threshold": 0,
        "block_size": 16,
        "preemption_mode": "recompute",
        "max_num_seqs": 256,
        "prefix_caching": "hash",
        "policy": "chunked",
    }
    with pytest.raises(SearchSpaceError, match="empty search space"):
        build_space(max_model_len=1024, overrides=everything_fixed)


def test_search_file_yaml_and_json(tmp_path) -> None:
    y = tmp_path / "s.yaml"
    y.write_text("block_size: [16, 32]\nlong_prefill_token_threshold: off\n")
    assert load_search_file(y) == {"block_size": [16, 32], "long_prefill_token_threshold": False}
    j = tmp_path / "s.json"
    j.write_text(json.dumps({"max_num_seqs": {"high": 128}}))
    assert load_search_file(j) == {"max_num_seqs": {"high": 128}}
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(SearchSpaceError, match="mapping"):
        load_search_file(bad)


def test_grid_holds_distinct_valid_configs() -> None:
    space = build_space(
        max_model_len=2048,
        overrides={
            "max_num_batched_tokens": [1024, 4096],
            "block_size": [16, 32],
            "max_num_seqs": [64, 256],
            "preemption_mode": "recompute",
            "prefix_caching": "hash",
            "long_prefill_token_threshold": {"low": 256, "high": 2048},
        },
    )
    grid = space.grid()
    configs = [space.config_from_params(p) for p in grid]
    keys = {json.dumps(c.to_dict(), sort_keys=True) for c in configs}
    assert len(keys) == len(grid)
    chunked = [c for c in configs if c.policy == "chunked"]
    # budget 1024: threshold off, 256, 512; budget 4096: off, 256, 512, 1024 (2048, at
    # max_model_len, never splits a prompt: it is off)
    assert len(chunked) == (3 + 4) * 2 * 2
    prefill_first = {c.max_num_batched_tokens for c in configs if c.policy == "prefill_first"}
    assert prefill_first == {2048, 4096}


def test_space_round_trips_through_a_dict_and_finds_the_baseline() -> None:
    vllm = get_target("vllm")
    space = build_space(max_model_len=2048, overrides={"max_num_seqs": {"high": 2048}}, target=vllm)
    again = SearchSpace.from_dict(json.loads(json.dumps(space.to_dict())))
    assert again == space

    class H100:
        name, memory_gib = "h100", 80

    base = vllm.defaults(H100(), max_model_len=2048)
    params = again.params_for(base)
    assert params is not None and params[THRESHOLD_GATE] is False
    assert again.config_from_params(params) == base
    narrow = build_space(max_model_len=2048, overrides={"block_size": [32, 64]}, target=vllm)
    assert narrow.params_for(base) is None


def test_kv_cache_dtype_is_searched_where_the_gpu_serves_fp8() -> None:
    from slotune.engine.sim import get_gpu

    h100 = build_space(max_model_len=2048, kv_cache_dtypes=get_gpu("h100").kv_cache_dtypes)
    assert "kv_cache_dtype" in h100.free_names
    assert h100.params["kv_cache_dtype"].values == ("auto", "fp8")
    configs = {h100.config_from_params(p).kv_cache_dtype for p in h100.grid()}
    assert configs == {"auto", "fp8"}
    a100 = build_space(max_model_len=2048, kv_cache_dtypes=get_gpu("a100-80g").kv_cache_dtypes)
    assert "kv_cache_dtype" not in a100.free_names
    assert {a100.config_from_params(p).kv_cache_dtype for p in a100.grid()} == {"auto"}
    widened = build_space(max_model_len=2048, overrides={"kv_cache_dtype": ["fp8", "int4"]})
    assert widened.params["kv_cache_dtype"].values == ("fp8", "int4")
    with pytest.raises(SearchSpaceError, match="'fp4' is not one of"):
        build_space(max_model_len=2048, overrides={"kv_cache_dtype": "fp4"})


def test_a_space_stored_before_the_kv_knob_keeps_its_fixed_dtype() -> None:
    stored = build_space(max_model_len=2048).to_dict()
    del stored["params"]["kv_cache_dtype"]
    stored["fixed"]["kv_cache_dtype"] = "int8"
    space = SearchSpace.from_dict(stored)
    assert {space.config_from_params(p).kv_cache_dtype for p in space.grid()} == {"int8"}


def test_speculation_is_off_unless_a_search_file_opts_in() -> None:
    from slotune.tuner.space import build_space, describe

    default = build_space(max_model_len=2048)
    assert "num_speculative_tokens" not in default.free_names
    assert "num_speculative_tokens" not in describe(default)
    assert all(
        default.config_from_params(p).num_speculative_tokens == 0 for p in default.grid()[:5]
    )
    space = build_space(
        max_model_len=2048,
        overrides={"num_speculative_tokens": [0, 2, 4], "block_size": 16, "policy": "chunked"},
    )
    assert "num_speculative_tokens" in space.free_names
    assert describe(space)["num_speculative_tokens"] == "0, 2, 4"
    values = {space.config_from_params(p).num_speculative_tokens for p in space.grid()}
    assert values == {0, 2, 4}
    config = space.config_from_params({**space.grid()[0], "num_speculative_tokens": 4})
    assert space.params_for(config) is not None
    restored = type(space).from_dict(space.to_dict())
    assert restored.params["num_speculative_tokens"].values == (0, 2, 4)


def test_a_stored_space_without_the_speculation_knob_still_loads() -> None:
    from slotune.tuner.space import SearchSpace, build_space

    data = build_space(max_model_len=2048).to_dict()
    del data["params"]["num_speculative_tokens"]
    assert SearchSpace.from_dict(data).params["num_speculative_tokens"].values == (0,)


def test_a_negative_speculation_count_is_refused() -> None:
    from slotune.tuner.space import SearchSpaceError, build_space

    with pytest.raises(SearchSpaceError, match="num_speculative_tokens"):
        build_space(max_model_len=2048, overrides={"num_speculative_tokens": [-1, 2]})


def test_policy_knobs_are_opt_in() -> None:
    default = build_space(max_model_len=2048)
    assert "scheduling_policy" not in default.free_names
    assert "swap_threshold_tokens" not in default.free_names
    assert {c.preemption_mode for _, c in sample(default, 60)} == {"recompute", "swap", "hybrid"}
    space = build_space(
        max_model_len=2048,
        overrides={
            "preemption_mode": ["recompute", "hybrid"],
            "swap_threshold_tokens": [512, 4096],
            "scheduling_policy": ["fcfs", "priority"],
        },
    )
    configs = [c for _, c in sample(space, 80)]
    assert {c.preemption_mode for c in configs} == {"recompute", "hybrid"}
    assert {c.swap_threshold_tokens for c in configs} == {512, 4096}
    assert {c.scheduling_policy for c in configs} == {"fcfs", "priority"}
    for params in space.grid()[:50]:
        assert space.params_for(space.config_from_params(params)) is not None
    with pytest.raises(SearchSpaceError, match="swap or hybrid needs swap_space_gb"):
        build_space(max_model_len=2048, overrides={"preemption_mode": "hybrid", "swap_space_gb": 0})
    with pytest.raises(SearchSpaceError, match="not one of"):
        build_space(max_model_len=2048, overrides={"scheduling_policy": "lifo"})
    tiers = build_space(
        max_model_len=2048,
        overrides={"top_tier_kv_share": [0, 0.25], "decode_budget_ms": [0, 50.0]},
    )
    configs = [c for _, c in sample(tiers, 60)]
    assert {c.top_tier_kv_share for c in configs} == {0, 0.25}
    assert {c.decode_budget_ms for c in configs} == {0, 50.0}
    with pytest.raises(SearchSpaceError, match="out of range"):
        build_space(max_model_len=2048, overrides={"top_tier_token_share": [0, 1.0]})
    assert {c.adaptive_chunk_ms for _, c in sample(build_space(max_model_len=2048), 20)} == {0}
    adaptive = build_space(max_model_len=2048, overrides={"adaptive_chunk_ms": [0, 30.0, 40.0]})
    assert {c.adaptive_chunk_ms for _, c in sample(adaptive, 60)} == {0, 30.0, 40.0}
    from slotune.targets import get_target

    with pytest.raises(SearchSpaceError, match="does not run"):
        build_space(
            max_model_len=2048,
            overrides={"adaptive_chunk_ms": [0, 30.0]},
            target=get_target("vllm==0.34"),
        )


def test_a_space_stored_before_the_policy_knobs_keeps_their_defaults() -> None:
    stored = build_space(max_model_len=2048).to_dict()
    for name in ("scheduling_policy", "swap_threshold_tokens", "decode_budget_ms"):
        del stored["params"][name]
    space = SearchSpace.from_dict(stored)
    configs = {space.config_from_params(p) for p in space.grid()[:20]}
    assert {(c.scheduling_policy, c.swap_threshold_tokens) for c in configs} == {("fcfs", 2048)}


def test_a_draft_model_searches_the_speculation_count_where_the_target_runs_it() -> None:
    draft = {"speculative_model": "/ckpt/draft"}
    for target in (None, get_target("vllm==0.34"), get_target("slotune")):
        space = build_space(max_model_len=2048, overrides=draft, target=target)
        assert space.params["num_speculative_tokens"].values == (0, 2, 4)
        configs = [c for _, c in sample(space, 30)]
        assert {c.num_speculative_tokens for c in configs} == {0, 2, 4}
        assert {c.speculative_model for c in configs} == {"/ckpt/draft"}
    given = build_space(max_model_len=2048, overrides={**draft, "num_speculative_tokens": [0, 5]})
    assert given.params["num_speculative_tokens"].values == (0, 5)
    # SGLang's STANDALONE speculation never mixes prefill and decode: prefill-first only
    sglang = get_target("sglang")
    space = build_space(max_model_len=2048, overrides=draft, target=sglang)
    assert space.params["policy"].values == ("prefill_first",)
    assert all(not sglang.problems(c) for _, c in sample(space, 20))
    with pytest.raises(SearchSpaceError, match=r"vllm==0\.15 does not run a draft model"):
        build_space(max_model_len=2048, overrides=draft, target=get_target("vllm==0.15"))
