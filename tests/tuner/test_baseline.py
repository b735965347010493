"""vLLM's serving defaults per card: large budget only on >= 70 GiB cards that are not A100s."""

from __future__ import annotations

import pytest

from slotune.tuner.baseline import gpu_spec, vllm_defaults


@pytest.mark.parametrize(
    ("gpu", "budget", "seqs"),
    [
        ("h100", 8192, 1024),
        ("h100-pcie", 8192, 1024),
        ("h200", 8192, 1024),
        ("b200", 8192, 1024),
        ("mi300x", 8192, 1024),
        ("a100-80g", 2048, 256),
        ("a100-40g", 2048, 256),
        ("l40s", 2048, 256),
        ("l4", 2048, 256),
        ("a10g", 2048, 256),
    ],
)
def test_vllm_defaults_per_gpu(gpu: str, budget: int, seqs: int) -> None:
    config = vllm_defaults(gpu_spec(gpu), max_model_len=4096)
    assert (config.max_num_batched_tokens, config.max_num_seqs) == (budget, seqs)
    assert config.block_size == 16
    assert config.preemption_mode == "recompute"
    assert config.prefix_caching == "hash"
    assert config.long_prefill_token_threshold == 0
    assert config.policy == "chunked"
    assert config.max_model_len == 4096


def test_unknown_gpu() -> None:
    with pytest.raises(ValueError, match="unknown GPU"):
        gpu_spec("tpu-v5")
