"""Trace file readers, one module per format, and format detection."""

from __future__ import annotations

import json
from pathlib import Path

from slotune.workloads.readers.csv_traces import (
    AZURE_COLUMNS,
    BURSTGPT_COLUMNS,
    read_azure,
    read_burstgpt,
    read_header,
)
from slotune.workloads.readers.errors import TraceFormatError, read_head
from slotune.workloads.readers.jsonl import read_slotune_jsonl
from slotune.workloads.readers.mooncake import read_mooncake
from slotune.workloads.readers.sharegpt import read_sharegpt
from slotune.workloads.readers.spec import read_spec_trace
from slotune.workloads.tokenizer import Tokenizer
from slotune.workloads.trace import Trace

FORMATS = ("slotune", "sharegpt", "mooncake", "azure", "burstgpt", "spec")
TEXT_FORMATS = ("slotune", "sharegpt")  # the formats read with a tokenizer: prompts may be text


def detect_format(path: Path) -> str:
    """The format of a trace file, from its extension and first line or header."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        header = read_header(path)
        if all(c in header for c in AZURE_COLUMNS):
            return "azure"
        if all(c in header for c in BURSTGPT_COLUMNS):
            return "burstgpt"
        raise TraceFormatError(
            path,
            "row 1",
            f"cannot tell the CSV format from header {header}; expected Azure columns "
            f"{list(AZURE_COLUMNS)} or BurstGPT columns {list(BURSTGPT_COLUMNS)} "
            "(or pass --format)",
        )
    head = read_head(path).lstrip()
    if head.startswith("["):
        return "sharegpt"
    if head.startswith("{") and '"slotune_spec"' in head[:200]:
        return "spec"
    first = head.split("\n", 1)[0]
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        if "hash_ids" in obj or "input_length" in obj:
            return "mooncake"
        if "slotune_trace" in obj or "output_len" in obj:
            return "slotune"
    raise TraceFormatError(
        path,
        "line 1",
        f"cannot tell the trace format; pass --format, one of {', '.join(FORMATS)}",
    )


def read_trace_file(
    path: Path,
    fmt: str | None,
    tokenizer: Tokenizer,
    *,
    num_requests: int | None,
    seed: int,
    multi_turn: bool,
) -> Trace:
    fmt = fmt or detect_format(path)
    if fmt == "spec":
        return read_spec_trace(path, num_requests=num_requests, seed=seed)
    if fmt == "sharegpt":
        return read_sharegpt(
            path, tokenizer, num_requests=num_requests, seed=seed, multi_turn=multi_turn
        )
    if multi_turn:
        raise ValueError(f"multi_turn applies to ShareGPT traces only, not to format {fmt!r}")
    if fmt == "slotune":
        return read_slotune_jsonl(path, tokenizer, seed)
    if fmt == "mooncake":
        return read_mooncake(path, seed=seed)
    if fmt == "azure":
        return read_azure(path, seed=seed)
    if fmt == "burstgpt":
        return read_burstgpt(path, seed=seed)
    raise ValueError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")


__all__ = ["FORMATS", "TEXT_FORMATS", "TraceFormatError", "detect_format", "read_trace_file"]
