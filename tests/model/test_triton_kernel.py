"""The Triton kernel, interpreted on the CPU, matches the torch backend.

It runs in a subprocess because ``TRITON_INTERPRET=1`` only takes effect when set before
triton defines the kernel, and other tests in this process may have imported it already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_interpreted_triton_kernel_matches_torch_backend() -> None:
    env = os.environ | {"TRITON_INTERPRET": "1"}
    script = Path(__file__).with_name("triton_check.py")
    result = subprocess.run(
        [sys.executable, str(script), "15"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")
