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
