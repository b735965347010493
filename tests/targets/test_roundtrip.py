"""Recommended = exported, field by field: each exported line, read back by a small reader
of the engine's flags (written from the engines' documentation, not from the table),
gives the configuration that was measured."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import pytest

from slotune.engine.config import EngineConfig
from slotune.targets import Launch, get_target, launch_words
from slotune.tuner.space import build_space

LAUNCH = Launch("org/model", gpu="h100", model="llama-3-8b")


def _flags(words: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--"):
            out[w] = words[i + 1]
            i += 2
        elif w.startswith("--") and words[i + 1 : i + 2] == ["-1"]:
            out[w] = "-1"
            i += 2
        else:
            out[w] = True
            i += 1
    return out


def read_vllm(words: list[str], max_model_len: int) -> EngineConfig:
    assert words[:3] == ["vllm", "serve", "org/model"]
    f = _flags(words[3:])
    kv = {"fp8": "fp8", "int8_per_token_head": "int8", "int4_per_token_head": "int4"}
    assert f.get("--enable-chunked-prefill") is True  # vLLM V1 always mixes chunks
    return EngineConfig(
        max_num_batched_tokens=int(f["--max-num-batched-tokens"]),
        long_prefill_token_threshold=int(f.get("--long-prefill-token-threshold", 0)),
        block_size=int(f["--block-size"]),
        max_num_seqs=int(f["--max-num-seqs"]),
        max_model_len=max_model_len,  # the trace's, not exported
        preemption_mode="recompute",  # vLLM V1 recomputes
        prefix_caching="none" if "--no-enable-prefix-caching" in f else "hash",
        policy="chunked",
        gpu_memory_utilization=float(f["--gpu-memory-utilization"]),
        num_gpu_blocks=int(f["--num-gpu-blocks-override"])
        if "--num-gpu-blocks-override" in f
        else None,
        kv_cache_dtype=kv.get(f.get("--kv-cache-dtype", "auto"), "auto"),  # type: ignore[arg-type]
    )


def read_sglang(words: list[str], max_model_len: int, memory: float) -> EngineConfig:
    assert words[:5] == ["python", "-m", "sglang.launch_server", "--model-path", "org/model"]
    f = _flags(words[5:])
    page = int(f["--page-size"])
    chunk = int(f["--chunked-prefill-size"])
    budget = int(f["--max-prefill-tokens"])
    assert chunk in (-1, budget)  # the budget caps a whole step's prefill
    assert ("--enable-mixed-chunk" in f) == (chunk != -1)
    total = f.get("--max-total-tokens")
    return EngineConfig(
        max_num_batched_tokens=budget,
        block_size=page,
        max_num_seqs=int(f["--max-running-requests"]),
        max_model_len=max_model_len,
        preemption_mode="recompute",  # SGLang retracts and recomputes
        prefix_caching="none" if "--disable-radix-cache" in f else "radix",
        policy="chunked" if chunk != -1 else "prefill_first",
        gpu_memory_utilization=memory,  # SGLang's fraction is derived; checked apart
        num_gpu_blocks=None if total is None else int(total) // page,
        kv_cache_dtype="fp8" if f.get("--kv-cache-dtype") == "fp8_e4m3" else "auto",
    )


def _configs(target_name: str, overrides: dict[str, Any] | None = None) -> list[EngineConfig]:
    target = get_target(target_name)
    kvs = ("auto", "fp8") if target_name != "vllm==0.34" else ("auto", "fp8", "int8", "int4")
    space = build_space(max_model_len=3000, overrides=overrides, kv_cache_dtypes=kvs, target=target)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=11))
    out = [target.defaults(type("G", (), {"name": "h100", "memory_gib": 80})(), max_model_len=3000)]
    for _ in range(80):
        trial = study.ask()
        out.append(space.suggest(trial))
        study.tell(trial, 0.0)
    return out


def _exported_fields(config: EngineConfig) -> EngineConfig:
    """The measured configuration, less what the engine fixes (swap space unused)."""
    return dataclasses.replace(config, swap_space_gb=EngineConfig.swap_space_gb)


@pytest.mark.parametrize("name", ["vllm==0.34", "vllm==0.15"])
@pytest.mark.parametrize("overrides", [None, {"num_gpu_blocks": 4000}])
def test_vllm_exports_read_back_to_the_measured_config(name: str, overrides: Any) -> None:
    target = get_target(name)
    for config in _configs(name, overrides):
        words = launch_words(config, target, LAUNCH)
        assert read_vllm(words, config.max_model_len) == _exported_fields(config)


@pytest.mark.parametrize("overrides", [None, {"num_gpu_blocks": 4000}])
def test_sglang_exports_read_back_to_the_measured_config(overrides: Any) -> None:
    target = get_target("sglang")
    for config in _configs("sglang", overrides):
        words = launch_words(config, target, LAUNCH)
        back = read_sglang(words, config.max_model_len, config.gpu_memory_utilization)
        assert back == _exported_fields(config)


def test_slotune_exports_every_field() -> None:
    target = get_target("slotune")
    for config in _configs("slotune"):
        f = _flags(launch_words(config, target, LAUNCH)[4:])
        for field in dataclasses.fields(EngineConfig):
            value = getattr(config, field.name)
            if value is None:
                continue
            flag = "--" + field.name.replace("_", "-").replace("-gb", "")
            assert str(f[flag]) == str(value), field.name
