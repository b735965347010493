"""EngineConfig rejects every invalid value or combination, naming the field and the rule."""

from __future__ import annotations

import pytest

from slotune.engine import EngineConfig


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens", "at least 1"),
        ({"max_num_batched_tokens": 2.5}, "max_num_batched_tokens", "integer"),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold", "0 (off)"),
        ({"block_size": 12}, "block_size", "power of two"),
        ({"block_size": 0}, "block_size", "power of two"),
        ({"block_size": True}, "block_size", "integer"),
        ({"max_num_seqs": 0}, "max_num_seqs", "at least 1"),
        ({"max_model_len": 0}, "max_model_len", "at least 1"),
        ({"preemption_mode": "drop"}, "preemption_mode", "one of"),
        ({"prefix_caching": "lru"}, "prefix_caching", "one of"),
        ({"policy": "fcfs"}, "policy", "one of"),
        ({"swap_space_gb": -1.0}, "swap_space_gb", "non-negative"),
        ({"preemption_mode": "swap", "swap_space_gb": 0}, "swap_space_gb", "positive"),
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization", "(0, 1]"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization", "(0, 1]"),
        ({"num_gpu_blocks": 0}, "num_gpu_blocks", "at least 1"),
        ({"kv_cache_dtype": "fp16"}, "kv_cache_dtype", "one of ('auto', 'fp8', 'int8', 'int4')"),
        (
            {"policy": "prefill_first", "long_prefill_token_threshold": 64},
            "long_prefill_token_threshold",
            "prefill_first",
        ),
        (
            {"policy": "prefill_first", "max_num_batched_tokens": 512, "max_model_len": 1024},
            "max_num_batched_tokens",
            "max_model_len",
        ),
    ],
)
def test_invalid_config_names_field_and_rule(kwargs: dict, field: str, rule: str) -> None:
    with pytest.raises(ValueError) as err:
        EngineConfig(**kwargs)
    assert f"EngineConfig.{field}" in str(err.value)
    assert rule in str(err.value)


def test_valid_configs_round_trip() -> None:
    config = EngineConfig(
        policy="prefill_first",
        max_num_batched_tokens=8192,
        max_model_len=4096,
        kv_cache_dtype="fp8",
    )
    assert EngineConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown field"):
        EngineConfig.from_dict({"max_batch": 3})


def test_chunk_cap_is_the_threshold_or_else_the_budget() -> None:
    from slotune.engine.kv_cache.manager import KVCacheManager
    from slotune.engine.scheduler import Scheduler

    off = EngineConfig(max_num_batched_tokens=512)
    on = EngineConfig(max_num_batched_tokens=512, long_prefill_token_threshold=128)
    assert (off.chunk_cap, on.chunk_cap) == (512, 128)
    for config, chunk in ((off, 512), (on, 128)):
        scheduler = Scheduler(config, KVCacheManager(64, 0, config.block_size, "none"))
        assert scheduler.threshold == chunk
