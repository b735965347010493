"""Targets: each release's defaults per GPU, constraints, search space and flag table."""

from __future__ import annotations

import dataclasses
import itertools

import optuna
import pytest

from slotune.engine.config import EngineConfig
from slotune.engine.sim.stack import load_stack
from slotune.targets import FLAGS, TARGETS, ExportRefused, Launch, get_target, launch_words
from slotune.tuner.baseline import gpu_spec
from slotune.tuner.space import SearchSpaceError, build_space

ALL = list(TARGETS.values())
H100_KV = ("auto", "fp8")


@pytest.mark.parametrize(
    ("gpu", "v015", "v034", "sglang"),
    [
        ("h100", (8192, 1024), (8192, 1024), (8192, 4096)),
        ("h200", (8192, 1024), (8192, 1024), (8192, 4096)),
        ("b200", (8192, 1024), (16384, 1024), (16384, 4096)),
        ("mi300x", (8192, 1024), (16384, 1024), (16384, 4096)),
        ("a100-80g", (2048, 256), (2048, 256), (8192, 4096)),
        ("a100-40g", (2048, 256), (2048, 256), (4096, 4096)),
        ("l40s", (2048, 256), (2048, 256), (4096, 4096)),
        ("l4", (2048, 256), (2048, 256), (4096, 4096)),
    ],
)
def test_defaults_per_gpu(gpu: str, v015: tuple, v034: tuple, sglang: tuple) -> None:
    spec = gpu_spec(gpu)
    for name, expected in (("vllm==0.15", v015), ("vllm", v034), ("sglang", sglang)):
        c = get_target(name).defaults(spec, max_model_len=4096)
        assert (c.max_num_batched_tokens, c.max_num_seqs) == expected, name
        assert c.long_prefill_token_threshold == 0 and c.max_model_len == 4096
        assert get_target(name).problems(c) == []  # a target runs its own defaults
    vllm = get_target("vllm").defaults(spec, max_model_len=4096)
    assert (vllm.block_size, vllm.prefix_caching, vllm.policy) == (16, "hash", "chunked")
    sgl = get_target("sglang").defaults(spec, max_model_len=4096)
    assert (sgl.block_size, sgl.prefix_caching) == (1, "radix")


def test_registry_names_and_stacks() -> None:
    assert get_target().name == get_target("vllm").name == "vllm==0.34"
    assert get_target("vllm==0.15.1").name == "vllm==0.15"
    assert get_target("SGLang").name == "sglang==0.5.23"
    with pytest.raises(ValueError, match="unknown target 'trt'"):
        get_target("trt")
    for t in ALL:
        assert load_stack(t.stack).name == t.stack  # every stack profile ships


def test_the_flag_table_has_one_row_per_field_per_target() -> None:
    assert set(FLAGS) == {f.name for f in dataclasses.fields(EngineConfig)}
    assert all(set(rules) == set(TARGETS) for rules in FLAGS.values())


@pytest.mark.parametrize(
    ("target", "config", "reason"),
    [
        ("vllm", {"preemption_mode": "swap"}, "does not run preemption_mode=swap"),
        ("vllm", {"prefix_caching": "radix"}, "does not run prefix_caching=radix"),
        ("vllm", {"block_size": 256}, "does not run block_size=256"),
        ("vllm", {"block_size": 8}, "does not run block_size=8"),
        ("vllm==0.15", {"kv_cache_dtype": "int8"}, "does not run kv_cache_dtype=int8"),
        (
            "vllm",
            {"policy": "prefill_first", "max_num_batched_tokens": 4096},
            "does not run policy=prefill_first",
        ),
        (
            "vllm",
            {"max_num_batched_tokens": 512, "max_num_seqs": 768},
            "needs max_num_batched_tokens >= max_num_seqs (512 < 768)",
        ),
        (
            "vllm",
            {"long_prefill_token_threshold": 4096, "max_num_batched_tokens": 8192},
            "exceeds max_model_len 2048",
        ),
        ("sglang", {"prefix_caching": "hash"}, "does not run prefix_caching=hash"),
        ("sglang", {"long_prefill_token_threshold": 256}, "no per-request long-prefill"),
        ("sglang", {"kv_cache_dtype": "int4"}, "does not run kv_cache_dtype=int4"),
    ],
)
def test_constraints_refuse_with_the_reason(target: str, config: dict, reason: str) -> None:
    c = EngineConfig(max_model_len=2048, **config)
    problems = get_target(target).problems(c)
    assert any(reason in p for p in problems), problems
    with pytest.raises(ExportRefused, match=reason.split("(")[0].strip()):
        launch_words(c, get_target(target), Launch("m", gpu="h100", model="llama-3-8b"))


def test_slotune_runs_every_knob() -> None:
    t = get_target("slotune")
    for block, mode, prefix, kv in itertools.product(
        (8, 256), ("swap", "recompute"), ("hash", "radix"), ("int4", "int8")
    ):
        c = EngineConfig(block_size=block, preemption_mode=mode, prefix_caching=prefix)
        assert t.problems(dataclasses.replace(c, kv_cache_dtype=kv)) == []


def _sampled(space, n: int = 60) -> list[EngineConfig]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(space.suggest(trial))
        study.tell(trial, 0.0)
    return out


@pytest.mark.parametrize("target", ALL, ids=lambda t: t.name)
def test_the_default_space_emits_only_what_the_target_runs(target) -> None:
    space = build_space(max_model_len=3000, kv_cache_dtypes=H100_KV, target=target)
    configs = _sampled(space) + [space.config_from_params(p) for p in space.grid()[:400]]
    for c in configs:
        assert target.problems(c) == [], c
        assert c.long_prefill_token_threshold < c.max_model_len
        if target.budget_ge_seqs:
            assert c.max_num_batched_tokens >= c.max_num_seqs


def test_space_values_follow_the_target() -> None:
    v = build_space(max_model_len=2048, kv_cache_dtypes=H100_KV, target=get_target("vllm"))
    assert v.params["block_size"].values == (16, 32, 64, 128)
    assert v.params["preemption_mode"].is_fixed and v.params["policy"].is_fixed
    assert v.params["kv_cache_dtype"].values == ("auto", "fp8")  # int8/int4 not on the GPU
    assert v.params["long_prefill_token_threshold"].high == 2047
    s = build_space(max_model_len=2048, kv_cache_dtypes=H100_KV, target=get_target("sglang"))
    assert s.params["long_prefill_token_threshold"].values == (0,)
    assert s.params["prefix_caching"].values == ("none", "radix")
    a100 = build_space(max_model_len=2048, kv_cache_dtypes=("auto",), target=get_target("vllm"))
    assert a100.params["kv_cache_dtype"].values == ("auto",)
    own = build_space(max_model_len=2048, kv_cache_dtypes=("auto",), target=get_target("slotune"))
    assert own.params["kv_cache_dtype"].values == ("auto", "fp8", "int8", "int4")


def test_narrowed_budget_never_falls_below_seqs() -> None:
    """Issue 24: a search narrowed to budget 256-768 produced winners vLLM rejects."""
    space = build_space(
        max_model_len=2048,
        overrides={"max_num_batched_tokens": {"low": 256, "high": 768}},
        target=get_target("vllm"),
    )
    for c in _sampled(space, 80):
        assert c.max_num_batched_tokens >= c.max_num_seqs


@pytest.mark.parametrize(
    ("target", "override", "message"),
    [
        ("vllm", {"block_size": [16, 256]}, "vllm==0.34 does not run 256"),
        ("vllm", {"preemption_mode": "swap"}, "does not run 'swap'"),
        ("vllm", {"prefix_caching": ["hash", "radix"]}, "does not run 'radix'"),
        ("sglang", {"long_prefill_token_threshold": {"low": 64}}, "no per-request long-prefill"),
        ("vllm==0.15", {"kv_cache_dtype": ["auto", "int8"]}, "does not run 'int8'"),
    ],
)
def test_search_overrides_outside_the_target_are_refused(
    target: str, override: dict, message: str
) -> None:
    with pytest.raises(SearchSpaceError, match=message):
        build_space(max_model_len=2048, overrides=override, target=get_target(target))


def test_search_overrides_inside_the_target() -> None:
    space = build_space(
        max_model_len=2048,
        overrides={"kv_cache_dtype": ["auto", "int8", "int4"], "long_prefill_token_threshold": 0},
        target=get_target("vllm"),
    )
    assert space.params["kv_cache_dtype"].values == ("auto", "int8", "int4")
    sgl = build_space(
        max_model_len=2048,
        overrides={"long_prefill_token_threshold": "off"},
        target=get_target("sglang"),
    )
    assert sgl.params["long_prefill_token_threshold"].values == (0,)
