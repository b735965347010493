import pytest

from slotune.engine.config import EngineConfig
from slotune.engine.sim import determine_capacity, get_model, load_profile
from slotune.engine.sim.capacity import activation_workspace_bytes, kv_block_bytes

GIB = 1 << 30


def test_llama_2_7b_block_count_matches_the_hand_calculation() -> None:
    profile, model = load_profile("a100-80g"), get_model("llama-2-7b")
    config = EngineConfig(
        max_num_batched_tokens=512,
        max_num_seqs=256,
        block_size=16,
        gpu_memory_utilization=0.9,
        swap_space_gb=4,
    )
    # By hand: 0.9 × 80 GiB, less 13.48 GB of weights, 1 GiB runtime reserve, and the
    # activations of a 512-token step (per token 2 B × (3·4096 + 3·4096 + 3·11008)) plus
    # fp32 logits of 256 sampled rows; divided by 16 tokens × 0.5 MiB.
    usable = 0.9 * 80 * GIB
    weights = model.weight_bytes
    assert weights == pytest.approx(13.5e9, rel=0.005)
    activations = 512 * 2 * (3 * 4096 + 3 * 4096 + 3 * 11008) + 256 * 32000 * 4
    block = 16 * 512 * 1024
    expected = int((usable - weights - 1 * GIB - activations) // block)
    capacity = determine_capacity(profile, model, 1, config)
    assert capacity.num_gpu_blocks == expected
    assert 7300 < expected < 7600
    assert capacity.num_cpu_blocks == 4 * GIB // block == 512


def test_a_bigger_token_budget_costs_kv_blocks() -> None:
    profile, model = load_profile("h100"), get_model("llama-3-8b")
    small = determine_capacity(profile, model, 1, EngineConfig(max_num_batched_tokens=512))
    big = determine_capacity(profile, model, 1, EngineConfig(max_num_batched_tokens=16384))
    assert big.num_gpu_blocks < small.num_gpu_blocks
    grown = activation_workspace_bytes(model, 1, 16384, 256) - activation_workspace_bytes(
        model, 1, 512, 256
    )
    freed_blocks = small.num_gpu_blocks - big.num_gpu_blocks
    assert freed_blocks == pytest.approx(grown / kv_block_bytes(model, 1, 16), abs=1)


def test_tensor_parallelism_shards_weights_and_kv() -> None:
    profile, model = load_profile("h100"), get_model("llama-2-70b")
    with pytest.raises(ValueError, match="does not fit"):
        determine_capacity(profile, model, 1, EngineConfig())
    tp4 = determine_capacity(profile, model, 4, EngineConfig())
    assert tp4.num_gpu_blocks > 0
    assert kv_block_bytes(model, 4, 16) == kv_block_bytes(model, 1, 16) // 4


def test_block_size_divides_the_same_memory() -> None:
    profile, model = load_profile("h100"), get_model("llama-2-7b")
    b16 = determine_capacity(profile, model, 1, EngineConfig(block_size=16)).num_gpu_blocks
    b32 = determine_capacity(profile, model, 1, EngineConfig(block_size=32)).num_gpu_blocks
    assert b32 in (b16 // 2, b16 // 2 - 1, b16 // 2 + 1)


def test_an_explicit_pool_size_overrides_a_model_that_does_not_fit() -> None:
    profile, model = load_profile("l4"), get_model("llama-2-70b")
    capacity = determine_capacity(profile, model, 1, EngineConfig(num_gpu_blocks=100))
    assert capacity.num_gpu_blocks == 0  # the engine takes num_gpu_blocks from the config
