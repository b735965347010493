from __future__ import annotations

import logging
import os

import pytest
import torch

from slotune.engine.model.attention import select_backend

CPU = torch.device("cpu")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="interpreter enabled")
def test_auto_on_the_cpu_is_the_torch_reference() -> None:
    assert select_backend("auto", CPU, 16, torch.float32).name == "torch"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="interpreter enabled")
def test_an_accelerator_backend_falls_back_with_a_logged_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        backend = select_backend("flash", CPU, 256, torch.bfloat16)
    assert backend.name == "torch"
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "flash-attn needs a CUDA device" in messages
    assert "triton needs CUDA" in messages


def test_an_unknown_backend_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown backend 'cudnn'"):
        select_backend("cudnn", CPU, 16, torch.float32)
