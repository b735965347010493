from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slotune.engine.hf_config import ModelConfig
from slotune.engine.model.loader import load_model
from tests.model.paged import PagedRunner
from tests.model.test_llama_vs_hf import ATOL, hf_logits, prompt


def test_sharded_checkpoint_loads_through_its_index(sharded_dir: Path) -> None:
    index = json.loads((sharded_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    ids = prompt(30, 0)
    model = load_model(sharded_dir, device="cpu").model
    got = PagedRunner(model, 16).step([("a", ids)])[0]
    torch.testing.assert_close(got, hf_logits(sharded_dir, ids), atol=ATOL, rtol=0)


def test_tied_embeddings_and_qkv_bias(qwen2_dir: Path) -> None:
    loaded = load_model(qwen2_dir, device="cpu")
    assert loaded.config.tie_word_embeddings and loaded.config.attention_bias
    assert loaded.model.lm_head.weight is loaded.model.embed_tokens.weight
    assert loaded.model.layers[0].self_attn.qkv_proj.bias.abs().sum() > 0


def test_eos_from_generation_config_and_tokenizer(tiny_dir: Path) -> None:
    loaded = load_model(tiny_dir, device="cpu", dtype="bfloat16")
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    assert loaded.eos_token_ids == (gen["eos_token_id"],)
    assert loaded.tokenizer is not None
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.model.rotary.inv_freq.dtype == torch.float32


def test_missing_folder_and_bad_config_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_model(tmp_path, device="cpu")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        load_model(tmp_path, device="cpu")


def test_config_reads_both_rope_formats() -> None:
    base = dict(
        model_type="llama", vocab_size=10, hidden_size=64, intermediate_size=8,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    scaling = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}
    old = ModelConfig.from_hf_dict(base | {"rope_theta": 5e5, "rope_scaling": scaling})
    new = ModelConfig.from_hf_dict(base | {"rope_parameters": scaling | {"rope_theta": 5e5}})
    assert old == new
    assert old.rope_theta == 5e5 and old.rope_scaling.factor == 8.0 and old.head_dim == 16
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        ModelConfig.from_hf_dict(base | {"rope_scaling": {"rope_type": "yarn"}})
    with pytest.raises(ValueError, match="'intermediate_size' is missing"):
        ModelConfig.from_hf_dict({k: v for k, v in base.items() if k != "intermediate_size"})


MIXTRAL_8X7B = dict(
    architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=32000,
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6,
)  # fmt: skip
QWEN15_MOE_A27B = dict(
    architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", vocab_size=151936,
    hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
    num_key_value_heads=16, num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632, decoder_sparse_step=1, norm_topk_prob=False,
)  # fmt: skip


def test_moe_fields_of_published_configs() -> None:
    mixtral = ModelConfig.from_hf_dict(MIXTRAL_8X7B)
    assert mixtral.moe is not None and not mixtral.attention_bias
    assert (mixtral.moe.num_experts, mixtral.moe.num_experts_per_tok) == (8, 2)
    assert mixtral.moe.moe_intermediate_size == 14336 and mixtral.moe.norm_topk_prob
    assert mixtral.moe.moe_layers == tuple(range(32))
    assert mixtral.moe.shared_expert_intermediate_size == 0

    qwen = ModelConfig.from_hf_dict(QWEN15_MOE_A27B)
    assert qwen.moe is not None and qwen.attention_bias  # no qkv_bias key: biased, as before 4.51
    assert (qwen.moe.num_experts, qwen.moe.num_experts_per_tok) == (60, 4)
    assert qwen.moe.moe_intermediate_size == 1408 and not qwen.moe.norm_topk_prob
    assert qwen.moe.shared_expert_intermediate_size == 5632
    assert qwen.moe.moe_layers == tuple(range(24))
    assert ModelConfig.from_hf_dict({**MIXTRAL_8X7B, "model_type": "llama"}).moe is None


def test_qwen3_moe_fields_as_published_and_as_transformers_5_writes_them() -> None:
    published = {
        **QWEN15_MOE_A27B,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "head_dim": 128,
        "attention_bias": False,
    }
    del published["shared_expert_intermediate_size"]
    q = ModelConfig.from_hf_dict(published)
    assert q.moe is not None and q.qk_norm and not q.attention_bias
    assert (q.moe.num_experts, q.moe.num_experts_per_tok, q.moe.moe_intermediate_size) == (
        128,
        8,
        768,
    )
    assert q.moe.norm_topk_prob and q.moe.shared_expert_intermediate_size == 0
    renamed = {k: v for k, v in published.items() if k != "num_experts"}
    assert ModelConfig.from_hf_dict(renamed | {"num_local_experts": 128}) == q


def test_qwen2_moe_layer_frequency_and_dense_layers() -> None:
    sparse = {**QWEN15_MOE_A27B, "num_hidden_layers": 6, "decoder_sparse_step": 2}
    assert ModelConfig.from_hf_dict(sparse).moe.moe_layers == (1, 3, 5)
    dense = {**sparse, "mlp_only_layers": [3]}
    assert ModelConfig.from_hf_dict(dense).moe.moe_layers == (1, 5)
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(9\) must be between 1 and"):
        ModelConfig.from_hf_dict({**MIXTRAL_8X7B, "num_experts_per_tok": 9})


def test_shape_only_families_are_refused_by_the_torch_executor(tmp_path: Path) -> None:
    gpt_oss = {**MIXTRAL_8X7B, "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"]}
    assert ModelConfig.from_hf_dict(gpt_oss).moe is not None
    (tmp_path / "config.json").write_text(json.dumps(gpt_oss))
    with pytest.raises(ValueError, match=r"cannot run 'gpt_oss' models.*simulate"):
        load_model(tmp_path, device="cpu")


def test_quantized_checkpoint_is_named_and_refused(tmp_path: Path) -> None:
    data = {**MIXTRAL_8X7B, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}
    assert ModelConfig.from_hf_dict(data).quantization == "fp8"
    assert ModelConfig.from_hf_dict(MIXTRAL_8X7B).quantization is None
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="quantized with 'fp8' cannot be loaded"):
        load_model(tmp_path, device="cpu")


def test_moe_layers_route_as_transformers_does(
    qwen2_moe_dir: Path, mixtral_dir: Path, qwen3_moe_dir: Path
) -> None:
    """Same experts and weights per token as the HF router; Qwen2-MoE's dense layer 0 and
    Qwen3-MoE's layer 1 stay dense, Qwen2-MoE's routed layers carry the shared expert."""
    from transformers import AutoModelForCausalLM

    from slotune.engine.model.mlp import MLP, SparseMoE

    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(0))
    cases = ((qwen2_moe_dir, (1, 2)), (mixtral_dir, (0, 1)), (qwen3_moe_dir, (0, 2)))
    for folder, routed in cases:
        ours = load_model(folder, device="cpu").model
        hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).model
        for i, layer in enumerate(ours.layers):
            assert isinstance(layer.mlp, SparseMoE if i in routed else MLP)
            if i not in routed:
                continue
            assert (layer.mlp.shared_expert is not None) == (folder == qwen2_moe_dir)
            experts, weights = layer.mlp.route(x)
            _, hf_weights, hf_experts = hf.layers[i].mlp.gate(x)
            assert torch.equal(experts, hf_experts)
            torch.testing.assert_close(weights, hf_weights.to(weights.dtype))
            assert len(experts.unique()) == layer.mlp.gate.out_features  # every expert used
