"""The engine knobs a user sets one by one (``slotune bench``/``serve`` flags, or the
Python API), and the one place that turns them, over an optional JSON source, into an
``EngineConfig``.

``EngineKnobs`` has one field per knob, named as the ``EngineConfig`` field it sets;
None means "not given" (the source's value, else the default). Adding a knob: a field
here and the flag in each command (``slotune/cli/engine_options.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from slotune.engine.config import EngineConfig


@dataclass(frozen=True)
class EngineKnobs:
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    preemption_mode: str | None = None
    prefix_caching: str | None = None
    policy: str | None = None
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float | None = None
    swap_space_gb: float | None = None
    kv_cache_dtype: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    speculative_model: str | None = None
    speculative_acceptance: float | None = None
    scheduling_policy: str | None = None
    swap_threshold_tokens: int | None = None
    top_tier_kv_share: float | None = None
    top_tier_token_share: float | None = None
    decode_budget_ms: float | None = None
    adaptive_chunk_ms: float | None = None

    def given(self) -> dict[str, Any]:
        """The knobs that were set, as ``EngineConfig`` fields."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not None}


def read_config_source(source: str) -> dict[str, Any]:
    """The ``EngineConfig`` fields in ``source``: a JSON file or inline JSON (best.json and
    summary.json work: their ``config``). ValueError naming ``--config``."""
    try:
        text = source if source.lstrip().startswith("{") else Path(source).read_text()
        data = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--config: cannot read {source}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]  # best.json or summary.json
    if not isinstance(data, dict):
        raise ValueError("--config: expected a JSON object of EngineConfig fields")
    return data


def engine_config(
    source: str | None, knobs: EngineKnobs, default_max_model_len: Callable[[], int]
) -> EngineConfig:
    """``EngineConfig`` from ``source`` (see ``read_config_source``), then the knobs that
    were given; ``max_model_len`` from the default when neither sets it. ValueError with a
    message for the user."""
    data = read_config_source(source) if source else {}
    data.update(knobs.given())
    if "max_model_len" not in data:
        data["max_model_len"] = default_max_model_len()
    try:
        return EngineConfig.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"engine config: {exc}") from None
