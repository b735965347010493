"""MoE in the simulator: catalogue shapes, HF configs, and expert pricing against
hand-computed rooflines on a GPU whose kernels run at their datasheet floor."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from slotune.engine.config import EngineConfig
from slotune.engine.sim import CostModel, determine_capacity, get_model, load_profile
from slotune.engine.sim.capacity import activation_workspace_bytes, kv_block_bytes
from slotune.engine.sim.moe import (
    MoECost,
    busiest_rank_load,
    expected_max_std_normal,
    experts_touched,
)
from tests.sim.unit_profile import BF16, BW, FP8, LINK, unit_profile

GIB = 1 << 30
H, F = 4096, 14336  # Mixtral-8x7B


# Published totals and active counts (model cards and papers), in billions. DeepSeek and
# OpenAI count active parameters without the vocabulary matrix that only looks tokens up
# (``no_embed``); Llama 4 Scout's 109 B and Maverick's 400 B include a ~1 B vision encoder.
PUBLISHED = [
    ("mixtral-8x7b", 46.7, 12.9, False),
    ("mixtral-8x22b", 140.6, 39.2, False),
    ("qwen1.5-moe-a2.7b", 14.3, 2.7, False),
    ("qwen2-moe-57b-a14b", 57.4, 14.2, False),
    ("qwen3-30b-a3b", 30.5, 3.3, False),
    ("deepseek-v2-lite", 15.7, 2.4, True),
    ("deepseek-v3", 671.0, 37.0, False),
    ("gpt-oss-20b", 20.9, 3.6, True),
    ("gpt-oss-120b", 116.8, 5.1, True),
    ("llama-4-scout", 109.0, 17.0, False),
    ("llama-4-maverick", 400.0, 17.0, False),
]
TOTAL_TOL, ACTIVE_TOL = 0.015, 0.03


@pytest.mark.parametrize(("name", "total", "active", "no_embed"), PUBLISHED)
def test_moe_parameter_counts_match_the_published_sizes(
    name: str, total: float, active: float, no_embed: bool
) -> None:
    m = get_model(name)
    embedding = m.vocab_size * m.hidden_size if no_embed else 0
    assert m.num_params / 1e9 == pytest.approx(total, rel=TOTAL_TOL)
    assert (m.active_params - embedding) / 1e9 == pytest.approx(active, rel=ACTIVE_TOL)


def test_expected_experts_touched_is_the_hand_formula_and_a_simulation() -> None:
    assert experts_touched(8, 2, 1) == pytest.approx(2.0)
    assert experts_touched(8, 2, 4) == pytest.approx(8 * (1 - 0.75**4))  # 5.47 of 8
    assert experts_touched(8, 2, 512) == pytest.approx(8.0)
    rng = np.random.default_rng(0)
    for experts, k, tokens in ((8, 2, 3), (64, 6, 10), (128, 8, 20)):
        picks = [
            len({int(e) for _ in range(tokens) for e in rng.choice(experts, k, replace=False)})
            for _ in range(3000)
        ]
        assert np.mean(picks) == pytest.approx(experts_touched(experts, k, tokens), rel=0.02)


def test_mixtral_expert_gemms_are_their_rooflines() -> None:
    cost = MoECost(unit_profile(), get_model("mixtral-8x7b"))
    # One token: 2 of the 8 experts are read, each with 1 row padded to the 16-row tile.
    one = cost.layer_ops(1)
    weights = 2 * H * 2 * F * 2  # two experts' gate/up weights in bf16
    acts = 2 * (2 * H + 2 * 2 * F)
    assert one["moe_up"] == pytest.approx(max((weights + acts) / BW, 2 * 32 * H * 2 * F / BF16))
    assert one["moe_up"] == pytest.approx((weights + acts) / BW)  # memory-bound
    # 4096 tokens: all 8 experts, 1024 rows each, compute-bound.
    big = cost.layer_ops(4096)
    assert big["moe_down"] == pytest.approx(2 * 8192 * F * H / BF16)
    assert big["router"] == pytest.approx(max(2 * (H * 8 + 4096 * H + 4096 * 8) / BW, 0))


def test_moe_layers_replace_the_dense_mlp() -> None:
    profile, model = unit_profile(), get_model("mixtral-8x7b")
    cm = CostModel(profile, model)
    moe = MoECost(profile, model)
    for t in (1, 37, 2048):
        ops = cm.layer_ops(t)
        attention = sum(v for k, v in ops.items() if not k.startswith("mlp_"))
        embed_and_norm = 2 * (2 * t * H * 2) / BW
        expected = 32 * (attention + sum(moe.layer_ops(t).values())) + embed_and_norm
        assert cm.dense_seconds(t) == pytest.approx(expected)
        b = cm.breakdown(t)
        layers = b.per_step["layers"] - 32 * b.per_layer["attention"]
        assert layers == pytest.approx(cm.dense_seconds(t) - embed_and_norm)


def test_first_dense_layer_of_deepseek_v2_lite_keeps_its_mlp() -> None:
    model = get_model("deepseek-v2-lite")
    assert model.moe is not None and model.moe.moe_layers == tuple(range(1, 27))
    cm = CostModel(unit_profile(), model)
    ops = cm.layer_ops(64)
    mlp = ops["mlp_up"] + ops["mlp_act"] + ops["mlp_down"]
    attention = sum(ops.values()) - mlp
    moe = sum(MoECost(unit_profile(), model).layer_ops(64).values())
    embed_and_norm = 2 * (2 * 64 * 2048 * 2) / BW
    assert cm.dense_seconds(64) == pytest.approx(27 * attention + mlp + 26 * moe + embed_and_norm)


def test_small_batches_read_few_experts_so_decode_grows_with_the_batch() -> None:
    cm = CostModel(load_profile("h100"), get_model("mixtral-8x7b"), 2)
    steps = [cm.decode_step_seconds(b, b * 500) for b in (1, 2, 4, 8, 64)]
    assert steps == sorted(steps)
    assert steps[3] > 1.8 * steps[0]  # 7.2 of 8 experts read against 2
    dense = CostModel(load_profile("h100"), get_model("mistral-7b"))  # Mixtral's attention
    assert dense.decode_step_seconds(8, 4000) < 1.2 * dense.decode_step_seconds(1, 500)


def test_expert_parallel_all_to_all_and_imbalance_by_hand() -> None:
    profile, model = unit_profile(), get_model("mixtral-8x7b")
    ep = MoECost(profile, model, tp=2, ep=2, imbalance=1.25)
    t = 4096
    # the busiest rank's rows: the mean, what chance adds for two ranks, the skew
    chance = 1 + math.sqrt(2 / math.pi) * math.sqrt(6 / (7 * t * 2))
    rows = t * 2 / 2 * chance * 1.25
    assert ep.rows_per_gpu(t) == pytest.approx(rows)
    # 4 local experts of full width, ~1295 rows each padded to 16: compute-bound
    padded = math.ceil(rows / 4 / 16) * 16 * 4
    assert ep.layer_ops(t)["moe_up"] == pytest.approx(2 * padded * H * 2 * F / BF16)
    one_way = (2 - 1) / 2 * (t / 2 * 2 * H * 2) / (LINK * 1e9 / 2)
    assert ep.layer_ops(t)["alltoall"] == pytest.approx(2 * one_way)
    tp_only = MoECost(profile, model, tp=2, ep=1)
    assert "alltoall" not in tp_only.layer_ops(t)
    assert tp_only.layer_ops(t)["moe_up"] == pytest.approx(2 * t * 2 * H * F / BF16)


def test_expert_parallel_size_is_checked() -> None:
    with pytest.raises(ValueError, match="expert parallel size 3"):
        CostModel(unit_profile(), get_model("mixtral-8x7b"), 4, ep=3)
    with pytest.raises(ValueError, match="needs a MoE model"):
        CostModel(unit_profile(), get_model("llama-3-8b"), 2, ep=2)


def test_mixtral_capacity_holds_every_expert_by_hand() -> None:
    profile, model = load_profile("h100"), get_model("mixtral-8x7b")
    config = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=128)
    # Per GPU of 2: attention (q, k, v, o shards) and all 8 experts' halves in bf16, the
    # routers, norms and half the vocabulary of embeddings and LM head.
    attention = H * (16 + 2 * 4) * 128 + 16 * 128 * H
    experts = 8 * 3 * H * F // 2
    other = 32 * (2 * H + H * 8) + 16000 * H * 2 + H
    weights = 2 * (32 * (attention + experts) + other)
    assert model.weight_bytes_per_gpu(2) == weights
    assert weights / GIB == pytest.approx(87.0 / 2, rel=0.01)
    activations = 2048 * 2 * (3 * H + 24 * 128 + 2 * (3 * F // 2 + H)) + 128 * 16000 * 4
    assert activation_workspace_bytes(model, 2, 2048, 128) == activations
    block = 32 * 2 * 16 * 4 * 128 * 2
    assert kv_block_bytes(model, 2, 16) == block
    usable = 0.9 * 80 * GIB
    expected = int((usable - weights - GIB - activations) // block)
    assert determine_capacity(profile, model, 2, config).num_gpu_blocks == expected


def test_hf_mixtral_and_qwen2_moe_configs_give_the_expert_shapes(tmp_path: Path) -> None:
    mixtral = {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "quantization_config": {"quant_method": "fp8"},
    }
    path = tmp_path / "mixtral" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(mixtral))
    m = get_model(str(path))
    catalogue = get_model("mixtral-8x7b")
    assert m.moe == catalogue.moe
    assert m.weight_dtype == "fp8"
    assert m.num_params == catalogue.num_params
    qwen = {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 2,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 151936,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(qwen))
    q = get_model(str(path))
    assert q.moe is not None
    assert q.moe.moe_layers == tuple(range(1, 24, 2)) and q.num_dense_layers == 12
    assert (q.moe.num_experts, q.moe.top_k, q.moe.expert_ffn, q.moe.shared_ffn) == (
        60,
        4,
        1408,
        5632,
    )


def test_fp8_experts_halve_the_weight_reads_and_use_the_fp8_rate() -> None:
    cost = MoECost(unit_profile(), get_model("mixtral-8x7b", "fp8"))
    one = cost.layer_ops(1)
    weights = 2 * H * 2 * F * 1
    acts = 2 * (2 * H + 2 * 2 * F)
    quantize = 3 * 2 * H
    assert one["moe_up"] == pytest.approx((weights + acts + quantize) / BW)
    big = cost.layer_ops(4096)
    assert big["moe_down"] == pytest.approx(2 * 8192 * F * H / FP8 + 3 * 8192 * F / BW)


def _busiest_by_monte_carlo(tokens: int, experts: int, k: int, ep: int, runs: int) -> float:
    """Route ``tokens`` tokens to ``k`` distinct uniformly random experts, ``runs`` times;
    the mean of the busiest rank's rows over the mean rows per rank. Each token's rows per
    rank are drawn as the ranks its ``k`` experts fall on: ``k`` draws without replacement
    from ``E`` experts, ``E/ep`` of each rank (a multivariate hypergeometric)."""
    rng = np.random.default_rng(tokens * 1000 + experts + k + ep)
    per_token = rng.multivariate_hypergeometric(
        [experts // ep] * ep, k, size=(runs, tokens), method="count"
    )
    busiest = per_token.sum(axis=1).max(axis=1)
    return float(busiest.mean()) / (tokens * k / ep)


def test_expected_max_of_normals_by_hand() -> None:
    assert expected_max_std_normal(1) == 0.0
    assert expected_max_std_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_std_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_std_normal(8) == pytest.approx(1.4236, abs=1e-4)  # tables


@pytest.mark.parametrize(
    ("experts", "k", "ep"),
    [(8, 2, 2), (8, 2, 4), (8, 2, 8), (64, 6, 8), (128, 8, 8), (256, 8, 32), (16, 1, 4)],
)
def test_busiest_rank_load_of_random_routing_against_a_monte_carlo(
    experts: int, k: int, ep: int
) -> None:
    for tokens in (1, 2, 8, 64, 512):
        rows_per_rank = tokens * k / ep
        got = busiest_rank_load(tokens, experts, k, ep)
        simulated = _busiest_by_monte_carlo(tokens, experts, k, ep, 4000)
        if rows_per_rank >= 16:
            tol = 0.03
        elif rows_per_rank >= 4:
            tol = 0.05 if ep <= 8 else 0.07
        else:  # rows dealt with replacement: exact for k = 1, else a little high
            assert got >= simulated * 0.99, (tokens, got, simulated)
            tol = 0.02 if k == 1 else 0.06 if experts >= 64 else 0.15
        assert got == pytest.approx(simulated, rel=tol), (tokens, got, simulated)
    # one token's rows can at most all land on one rank: ep times the mean
    assert busiest_rank_load(1, experts, k, ep) <= ep * min(k, experts / ep) / k


def test_small_batches_are_counted_exactly_by_hand() -> None:
    # two tokens, one expert each, two ranks: both on one rank half the time
    assert busiest_rank_load(2, 16, 1, 2) == pytest.approx(1.5)
    # one token's two rows over two ranks (with replacement): the same
    assert busiest_rank_load(1, 256, 2, 2) == pytest.approx(1.5)
    # one row, eight ranks: the busiest holds it, eight times the mean
    assert busiest_rank_load(1, 16, 1, 8) == pytest.approx(8.0)


def test_imbalance_falls_to_the_skew_as_batches_grow() -> None:
    model = get_model("mixtral-8x7b")
    ep = MoECost(unit_profile(), model, tp=2, ep=2)
    ratios = [ep.rows_per_gpu(t) / (t * 2 / 2) for t in (1, 16, 256, 65536)]
    assert ratios == sorted(ratios, reverse=True)
    assert ratios[0] == pytest.approx(1.25 * 1.5)  # one token's two rows on one rank or two
    assert ratios[1] == pytest.approx(1.25 * (1 + math.sqrt(2 / math.pi) * math.sqrt(3 / 112)))
    assert ratios[-1] == pytest.approx(1.25, rel=0.005)
