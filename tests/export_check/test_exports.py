"""Every launch line slotune exports, built by the real engine's own parser and config
builder (GPU faked, no kernels): each value must land where slotune meant it to.

Runs where ``vllm`` (0.34) or ``sglang`` (0.5.23) is importable: ``make check-export``
(the engines' install is in ``tests/export_check/README.md``); skipped elsewhere. The
values checked are every value of each target's default search space (one knob at a time
from the defaults, the range ends, plus random draws of the whole space) and ``--search``
overrides, on a small local checkpoint; refused exports must say why.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import optuna
import pytest

from slotune.engine.config import EngineConfig
from slotune.targets import ExportRefused, Launch, Target, get_target, launch_words
from slotune.tuner.baseline import gpu_spec
from slotune.tuner.space import SearchSpace, build_space


class _Engines:
    """``tests/export_check/engines.py`` (the harness), imported when a check needs it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name.startswith("pytest"):
            raise AttributeError(name)
        return getattr(pytest.importorskip("tests.export_check.engines"), name)


engines = _Engines()

GPU = "h100"
MAX_MODEL_LEN = 2048
SIM_MODEL = "llama-3-8b"  # prices the pool behind SGLang's --mem-fraction-static


def _installed(distribution: str) -> str | None:
    """The installed version, without importing the engine (the harness prepares that)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


VLLM = _installed("vllm")
SGLANG = _installed("sglang")
needs_vllm = pytest.mark.skipif(
    not (VLLM or "").startswith("0.34"), reason="needs vllm 0.34 (make check-export)"
)
needs_sglang = pytest.mark.skipif(
    not (SGLANG or "").startswith("0.5.23"), reason="needs sglang 0.5.23 (make check-export)"
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt")
    engines.make_hf_checkpoint(path)
    return path


def space_of(target: Target, overrides: dict[str, Any] | None = None) -> SearchSpace:
    return build_space(
        max_model_len=MAX_MODEL_LEN,
        overrides=overrides,
        kv_cache_dtypes=gpu_spec(GPU).kv_cache_dtypes,
        target=target,
    )


def emitted(space: SearchSpace, target: Target, draws: int = 25) -> list[EngineConfig]:
    """Every value of every knob at least once (from the target's defaults), the range
    ends, and random draws of the whole space; all as the space builds them."""
    base = target.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    out = [base]
    for name, p in space.params.items():
        values = [p.low, p.high] if p.is_range else list(p.values or ())
        for v in values:
            cfg = dataclasses.replace(base, **{name: v})
            if name == "long_prefill_token_threshold" and v and v >= cfg.max_num_batched_tokens:
                continue
            if cfg.policy == "prefill_first":
                cfg = dataclasses.replace(
                    cfg,
                    long_prefill_token_threshold=0,
                    max_num_batched_tokens=max(cfg.max_num_batched_tokens, MAX_MODEL_LEN),
                )
            if target.budget_ge_seqs:
                cfg = dataclasses.replace(
                    cfg, max_num_seqs=min(cfg.max_num_seqs, cfg.max_num_batched_tokens)
                )
            out.append(cfg)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(draws):
        trial = study.ask()
        out.append(space.suggest(trial))
        study.tell(trial, 0.0)
    unique = {json_key(c): c for c in out}
    return list(unique.values())


def json_key(c: EngineConfig) -> str:
    return repr(sorted(c.to_dict().items()))


def launch(checkpoint: Path, **kw: Any) -> Launch:
    return Launch(str(checkpoint), gpu=GPU, model=SIM_MODEL, served_given=True, **kw)


def vllm_resolve(argv: list[str]) -> dict[str, Any]:
    """vLLM's resolved config; an expected failure where the harness's stubbed kernels, not
    the engine's rules, stop the config builder (a kernel capability query)."""
    try:
        return engines.vllm_resolve(argv, gpu=GPU)
    except engines.EngineRejected as e:
        if "_OpNamespace" in str(e):
            pytest.xfail(f"harness: vLLM's config builder queried a stubbed kernel ({e})")
        raise


def field(resolved: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in resolved:
            return resolved[name]
    raise KeyError(f"none of {names} in the resolved config ({sorted(resolved)[:40]}...)")


# -- vLLM 0.34 ------------------------------------------------------------------------------


def vllm_check(config: EngineConfig, words: list[str], resolved: dict[str, Any]) -> None:
    assert field(resolved, "max_num_batched_tokens") == config.max_num_batched_tokens
    assert field(resolved, "max_num_seqs") == config.max_num_seqs
    threshold = field(resolved, "long_prefill_token_threshold")
    assert (threshold or 0) == config.long_prefill_token_threshold
    assert field(resolved, "block_size") == config.block_size
    assert bool(field(resolved, "enable_prefix_caching")) == (config.prefix_caching != "none")
    assert bool(field(resolved, "enable_chunked_prefill")) is True
    kv = field(resolved, "cache_dtype", "kv_cache_dtype")
    expected_kv = {
        "auto": "auto",
        "fp8": "fp8",
        "int8": "int8_per_token_head",
        "int4": "int4_per_token_head",
    }
    assert kv == expected_kv[config.kv_cache_dtype]
    assert field(resolved, "gpu_memory_utilization") == pytest.approx(config.gpu_memory_utilization)
    blocks = field(resolved, "num_gpu_blocks_override")
    assert blocks == config.num_gpu_blocks
    assert str(field(resolved, "scheduling_policy")).split(".")[-1].lower() == (
        config.scheduling_policy
    )
    spec = config.num_speculative_tokens
    assert field(resolved, "num_speculative_tokens") == (spec or None)
    if spec and config.speculative_model:
        assert field(resolved, "speculative_method") == "draft_model"
        assert field(resolved, "speculative_model") == config.speculative_model
    elif spec:
        assert field(resolved, "speculative_method") in ("ngram", "prompt_lookup")


@needs_vllm
def test_vllm_accepts_every_value_of_the_default_space(checkpoint: Path) -> None:
    target = get_target("vllm==0.34")
    for config in emitted(space_of(target), target):
        words = launch_words(config, target, launch(checkpoint))
        vllm_check(config, words, vllm_resolve(words[2:]))


@needs_vllm
@pytest.mark.parametrize(
    "overrides",
    [
        {"max_num_batched_tokens": {"low": 256, "high": 768}},  # issue 24: budget < seqs
        {"kv_cache_dtype": ["int8", "int4"], "block_size": [16]},
        {"gpu_memory_utilization": 0.8, "num_gpu_blocks": 3000},
        {"long_prefill_token_threshold": {"low": 1024, "high": 2047}},
        {"scheduling_policy": ["fcfs", "priority"], "num_speculative_tokens": [0, 3]},
    ],
)
def test_vllm_accepts_search_overrides(checkpoint: Path, overrides: dict[str, Any]) -> None:
    target = get_target("vllm==0.34")
    space = space_of(target, overrides)
    for config in emitted(space, target, draws=15):
        if target.problems(config):  # a defaults-derived case outside the narrowed space
            continue
        words = launch_words(config, target, launch(checkpoint))
        vllm_check(config, words, vllm_resolve(words[2:]))


@pytest.fixture(scope="module")
def draft_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft for ``checkpoint``: its vocabulary, one decoder layer."""
    return engines.make_hf_checkpoint(tmp_path_factory.mktemp("draft"), layers=1)


@needs_vllm
@pytest.mark.parametrize("k", [1, 3, 6])
def test_vllm_runs_the_draft_model(checkpoint: Path, draft_checkpoint: Path, k: int) -> None:
    target = get_target("vllm==0.34")
    base = target.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    config = dataclasses.replace(
        base, num_speculative_tokens=k, speculative_model=str(draft_checkpoint)
    )
    assert not target.problems(config)
    words = launch_words(config, target, launch(checkpoint))
    vllm_check(config, words, vllm_resolve(words[2:]))


@needs_vllm
def test_vllm_parallel(checkpoint: Path) -> None:
    target = get_target("vllm==0.34")
    config = target.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    words = launch_words(config, target, launch(checkpoint, tp=2))
    resolved = vllm_resolve(words[2:])
    assert field(resolved, "tensor_parallel_size") == 2
    # EP (--enable-expert-parallel) needs a MoE checkpoint, which the harness does not make


@needs_vllm
def test_vllm_online_fp8_weights(checkpoint: Path) -> None:
    target = get_target("vllm==0.34")
    config = target.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    words = launch_words(config, target, launch(checkpoint, quantization="fp8"))
    assert "fp8_per_tensor" in words
    resolved = vllm_resolve(words[2:])
    assert field(resolved, "quantization") == "fp8_per_tensor"


@needs_vllm
def test_vllm_defaults_are_the_baseline(checkpoint: Path) -> None:
    ours = get_target("vllm==0.34").defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    theirs = engines.vllm_defaults(checkpoint, GPU)
    assert field(theirs, "max_num_batched_tokens") == ours.max_num_batched_tokens
    assert field(theirs, "max_num_seqs") == ours.max_num_seqs
    assert bool(field(theirs, "enable_prefix_caching")) is True


@needs_vllm
def test_vllm_reads_the_yaml_config_file(checkpoint: Path, tmp_path: Path) -> None:
    from slotune.tuner.export import export

    target = get_target("vllm==0.34")
    config = dataclasses.replace(
        target.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN),
        prefix_caching="none",
        long_prefill_token_threshold=512,
        max_num_seqs=64,
    )
    best = {"config": config.to_dict(), "model": SIM_MODEL, "gpu": GPU, "target": target.name}
    path = tmp_path / "serve.yaml"
    path.write_text(export(best, "yaml", served_model=str(checkpoint)))
    resolved = vllm_resolve([str(checkpoint), "--config", str(path)])
    vllm_check(config, [], resolved)


@needs_vllm
@pytest.mark.parametrize("kind", ["awq", "gptq", "compressed-tensors"])
def test_vllm_serves_the_prequantized_checkpoint(tmp_path: Path, kind: str) -> None:
    """int4 weights: no --quantization flag; vLLM reads the checkpoint's method."""
    target = get_target("vllm==0.34")
    path = engines.make_hf_checkpoint(tmp_path / kind, quantization=kind)
    config = target.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    words = launch_words(config, target, launch(path, quantization="int4"))
    assert "--quantization" not in words
    resolved = vllm_resolve(words[2:])
    method = str(field(resolved, "quantization")).removeprefix("auto_")  # vLLM picks a kernel
    assert method.startswith(kind.split("-")[0])


# -- SGLang 0.5.23 --------------------------------------------------------------------------


def sglang_check(config: EngineConfig, words: list[str], resolved: dict[str, Any]) -> None:
    chunk = -1 if config.policy == "prefill_first" else config.max_num_batched_tokens
    assert field(resolved, "chunked_prefill_size") == chunk
    assert field(resolved, "max_prefill_tokens") == config.max_num_batched_tokens
    assert field(resolved, "page_size") == config.block_size
    assert field(resolved, "max_running_requests") == config.max_num_seqs
    assert bool(field(resolved, "disable_radix_cache")) == (config.prefix_caching == "none")
    if "enable_mixed_chunk" in resolved:
        assert bool(resolved["enable_mixed_chunk"]) == (config.policy == "chunked")
    assert ("--enable-mixed-chunk" in words) == (config.policy == "chunked")
    kv = {"auto": "auto", "fp8": "fp8_e4m3"}[config.kv_cache_dtype]
    assert field(resolved, "kv_cache_dtype") == kv
    frac = float(words[words.index("--mem-fraction-static") + 1])
    assert field(resolved, "mem_fraction_static") == pytest.approx(frac)
    total = field(resolved, "max_total_tokens")
    expected = None if config.num_gpu_blocks is None else config.num_gpu_blocks * config.block_size
    assert total == expected
    priority = config.scheduling_policy == "priority"
    assert bool(field(resolved, "enable_priority_scheduling")) is priority
    if priority:
        assert field(resolved, "schedule_low_priority_values_first") is True
    k = config.num_speculative_tokens
    if k and config.speculative_model:
        assert field(resolved, "speculative_algorithm") == "STANDALONE"
        assert field(resolved, "speculative_draft_model_path") == config.speculative_model
        assert field(resolved, "speculative_num_steps") == k
        assert field(resolved, "speculative_eagle_topk") == 1
        assert field(resolved, "speculative_num_draft_tokens") == k + 1
    else:
        assert field(resolved, "speculative_algorithm") in (None, "NONE")


@needs_sglang
def test_sglang_accepts_every_value_of_the_default_space(checkpoint: Path) -> None:
    target = get_target("sglang")
    for config in emitted(space_of(target), target):
        words = launch_words(config, target, launch(checkpoint))
        sglang_check(config, words, engines.sglang_resolve(words[3:], gpu=GPU))


@needs_sglang
@pytest.mark.parametrize(
    "overrides",
    [
        {"max_num_batched_tokens": {"low": 256, "high": 768}, "policy": "chunked"},
        {"num_gpu_blocks": 3000, "block_size": [16, 64]},
        {"scheduling_policy": ["fcfs", "priority"]},
    ],
)
def test_sglang_accepts_search_overrides(checkpoint: Path, overrides: dict[str, Any]) -> None:
    target = get_target("sglang")
    for config in emitted(space_of(target, overrides), target, draws=15):
        if target.problems(config):
            continue
        words = launch_words(config, target, launch(checkpoint))
        sglang_check(config, words, engines.sglang_resolve(words[3:], gpu=GPU))


@needs_sglang
@pytest.mark.parametrize("kind", ["awq", "gptq"])
def test_sglang_serves_the_prequantized_checkpoint(tmp_path: Path, kind: str) -> None:
    target = get_target("sglang")
    path = engines.make_hf_checkpoint(tmp_path / kind, quantization=kind)
    config = target.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    words = launch_words(config, target, launch(path, quantization="int4"))
    # a GPTQ checkpoint is named gptq_marlin (the only GPTQ method SGLang registers on CUDA)
    assert ("--quantization" in words) == (kind == "gptq")
    resolved = engines.sglang_resolve(words[3:], gpu=GPU)
    assert str(field(resolved, "quantization") or kind).startswith(kind)


@needs_sglang
@pytest.mark.parametrize("k", [1, 3, 6])
def test_sglang_runs_the_draft_model_as_standalone(
    checkpoint: Path, draft_checkpoint: Path, k: int
) -> None:
    target = get_target("sglang")
    base = target.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    config = dataclasses.replace(
        base,
        num_speculative_tokens=k,
        speculative_model=str(draft_checkpoint),
        policy="prefill_first",
        max_num_batched_tokens=max(base.max_num_batched_tokens, MAX_MODEL_LEN),
    )
    assert not target.problems(config)
    words = launch_words(config, target, launch(checkpoint))
    sglang_check(config, words, engines.sglang_resolve(words[3:], gpu=GPU))


@needs_sglang
def test_sglang_parallel(checkpoint: Path) -> None:
    target = get_target("sglang")
    config = target.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    words = launch_words(config, target, launch(checkpoint, tp=2))
    resolved = engines.sglang_resolve(words[3:], gpu=GPU)
    assert field(resolved, "tp_size") == 2


@needs_sglang
def test_sglang_defaults_are_the_baseline(checkpoint: Path) -> None:
    ours = get_target("sglang").defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN)
    theirs = engines.sglang_defaults(checkpoint, GPU)
    assert field(theirs, "chunked_prefill_size") == ours.max_num_batched_tokens
    assert bool(field(theirs, "disable_radix_cache")) is False


# -- refusals (no engine needed) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "change", "reason"),
    [
        ("vllm", {"preemption_mode": "swap"}, "does not run preemption_mode=swap"),
        ("vllm", {"prefix_caching": "radix"}, "does not run prefix_caching=radix"),
        ("vllm", {"block_size": 256}, "does not run block_size=256"),
        ("vllm", {"max_num_batched_tokens": 256, "max_num_seqs": 512}, "max_num_seqs"),
        ("sglang", {"prefix_caching": "hash"}, "does not run prefix_caching=hash"),
        ("sglang", {"long_prefill_token_threshold": 512}, "long-prefill threshold"),
        ("sglang", {"num_speculative_tokens": 3}, "NGRAM speculation drafts from a cache"),
        (
            "sglang",
            {"num_speculative_tokens": 3, "speculative_model": "d/m", "policy": "chunked"},
            "does not run policy=chunked with a draft model: its STANDALONE",
        ),
        (
            "vllm==0.15",
            {"num_speculative_tokens": 3, "speculative_model": "d/m"},
            "draft-model export against vLLM 0.34",
        ),
        (
            "vllm",
            {"num_speculative_tokens": 3, "speculative_model": "llama-3.2-1b"},
            "names a simulator catalogue model",
        ),
    ],
)
def test_refused_exports_say_why(target: str, change: dict[str, Any], reason: str) -> None:
    t = get_target(target)
    config = dataclasses.replace(t.defaults(gpu_spec(GPU), max_model_len=MAX_MODEL_LEN), **change)
    with pytest.raises(ExportRefused, match=reason):
        launch_words(config, t, Launch("m", gpu=GPU, model=SIM_MODEL))


def test_every_target_value_is_covered() -> None:
    """The cases above reach every categorical value each target runs."""
    opt_in = {"scheduling_policy": ["fcfs", "priority"]}  # the override cases above
    for name in ("vllm==0.34", "sglang"):
        target = get_target(name)
        configs = emitted(space_of(target), target, draws=0)
        configs += emitted(space_of(target, opt_in), target, draws=0)
        for knob, values in target.knob_values.items():
            seen = {getattr(c, knob) for c in configs}
            gpu_kv = gpu_spec(GPU).kv_cache_dtypes
            wanted = {v for v in values if knob != "kv_cache_dtype" or v in gpu_kv}
            assert wanted <= seen, (name, knob, wanted - seen)
    assert list(itertools.islice(emitted(space_of(get_target("vllm")), get_target("vllm")), 1))
