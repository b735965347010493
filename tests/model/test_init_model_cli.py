from __future__ import annotations

from pathlib import Path

import torch
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.engine.model.loader import load_model


def test_init_model_writes_a_checkpoint_transformers_and_we_load(tmp_path: Path) -> None:
    out = tmp_path / "m"
    result = CliRunner().invoke(app, ["init-model", str(out), "--preset", "tiny"])
    assert result.exit_code == 0, result.output
    loaded = load_model(out, device="cpu")
    assert loaded.config.num_hidden_layers == 2 and loaded.config.vocab_size == 512
    assert loaded.tokenizer is not None and loaded.eos_token_ids

    text = "The KV cache holds 1024 blocks; émoji 🚀 and\ttabs survive."
    ids = loaded.tokenizer.encode(text).ids
    assert loaded.tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges were learned
    assert max(ids) < loaded.config.vocab_size

    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32)
    assert hf.config.vocab_size == 512
    assert AutoTokenizer.from_pretrained(out, local_files_only=True).encode(text) == ids


def test_init_model_rejects_an_unknown_preset(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["init-model", str(tmp_path / "m"), "--preset", "huge"])
    assert result.exit_code == 2
    assert "unknown" in result.output
