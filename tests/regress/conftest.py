"""Tiny suites on a tiny trace, so that every regress test runs in about a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture()
def tiny_trace(tmp_path: Path) -> Path:
    """Eight requests of 48-112 prompt and 4-11 output tokens, in slotune's JSONL."""
    path = tmp_path / "tiny.jsonl"
    lines = [json.dumps({"slotune_trace": 1, "name": "tiny", "seed": 1})]
    for i in range(8):
        lines.append(json.dumps({"id": f"r{i}", "prompt_len": 48 + 8 * i, "output_len": 4 + i}))
    path.write_text("\n".join(lines) + "\n")
    return path


def sim_suite(trace: Path, config: str = "{max_num_batched_tokens: 256}") -> str:
    """A two-benchmark simulated suite on ``trace``; ``config`` is the first one's."""
    return f"""\
version: 1
defaults:
  backend: sim
  gpu: h100
  model: llama-3-8b
  trace: {trace}
  slo: ttft=100ms,tpot=50ms
  tolerances:
    ttft_ms.p99: +10%
    output_throughput: -5%
    slo_attainment: -0.01
benchmarks:
  - name: chat
    load: {{rate: 50}}
    config: {config}
  - name: burst
    config: {{max_num_batched_tokens: 512, prefix_caching: radix}}
    tolerances:
      e2el_ms.mean: ±0
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path
