"""Checkpoints for the model tests: our init-model output and transformers-made ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=4096,
)


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random values everywhere, biases and norm weights included, so that none is vacuous."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else 0.05 * noise)
    return model


MIXTRAL = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=96)
# Layer 0 dense (mlp_only_layers), 1 and 2 routed with a shared expert; top-k not renormalised.
QWEN2_MOE = dict(
    num_hidden_layers=3,
    num_experts=6,
    num_experts_per_tok=2,
    moe_intermediate_size=48,
    shared_expert_intermediate_size=80,
    mlp_only_layers=[0],
    decoder_sparse_step=1,
    norm_topk_prob=False,
)

# Layer 1 dense (mlp_only_layers), 0 and 2 routed, renormalised top-k, no shared expert.
QWEN3_MOE = dict(
    num_hidden_layers=3,
    head_dim=24,
    num_experts=6,
    num_experts_per_tok=2,
    moe_intermediate_size=48,
    mlp_only_layers=[1],
    decoder_sparse_step=1,
    norm_topk_prob=True,
)


def save_hf(folder: Path, family: str, seed: int = 0, **overrides: object) -> Path:
    import transformers as tf

    torch.manual_seed(seed)
    if family == "qwen2":
        config = tf.Qwen2Config(**(TINY | {"tie_word_embeddings": True} | overrides))
        model = tf.Qwen2ForCausalLM(config)
    elif family == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**(TINY | {"head_dim": 24} | overrides)))
    elif family == "mixtral":
        model = tf.MixtralForCausalLM(tf.MixtralConfig(**(TINY | MIXTRAL | overrides)))
    elif family == "qwen2_moe":
        model = tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(**(TINY | QWEN2_MOE | overrides)))
    elif family == "qwen3_moe":
        model = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**(TINY | QWEN3_MOE | overrides)))
    else:
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**(TINY | overrides)))
    _perturbed(model, seed).save_pretrained(
        folder, **({"max_shard_size": "100KB"} if family == "sharded" else {})
    )
    return folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from slotune.engine.model.init_model import init_model

    return init_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


@pytest.fixture(scope="session")
def llama3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    return save_hf(
        tmp_path_factory.mktemp("llama3"), "llama", seed=1, rope_theta=10000.0, rope_scaling=scaling
    )


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf(tmp_path_factory.mktemp("qwen2"), "qwen2", seed=2)


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf(tmp_path_factory.mktemp("qwen3"), "qwen3", seed=6)


@pytest.fixture(scope="session")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf(tmp_path_factory.mktemp("sharded"), "sharded", seed=3)


@pytest.fixture(scope="session")
def mixtral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf(tmp_path_factory.mktemp("mixtral"), "mixtral", seed=4)


@pytest.fixture(scope="session")
def qwen2_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf(tmp_path_factory.mktemp("qwen2_moe"), "qwen2_moe", seed=5)


@pytest.fixture(scope="session")
def qwen3_moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_hf(tmp_path_factory.mktemp("qwen3_moe"), "qwen3_moe", seed=7)
