"""Mooncake JSONL: ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}``.

Each hash id stands for one 512-token block of the prompt; equal ids are equal blocks.
They become prompt segments, so requests that share hash ids share real tokens and the
prefix cache sees the hits the trace recorded. The last block may be partial.
"""

from __future__ import annotations

from pathlib import Path

from slotune.workloads.limits import (
    MAX_SECONDS,
    MAX_SEGMENT_KEY,
    MAX_TIMESTAMP,
    MAX_TOKENS,
    check_int,
)
from slotune.workloads.readers.errors import TraceFormatError, at, iter_json_lines
from slotune.workloads.trace import Trace, TraceRequest

MOONCAKE_BLOCK_TOKENS = 512


def _int_field(path: Path, lineno: int, obj: dict, key: str, minimum: int, maximum: int) -> int:
    with at(path, f"line {lineno}"):
        return check_int(obj.get(key), f"field {key!r}", minimum=minimum, maximum=maximum)


def read_mooncake(path: Path, *, seed: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    requests: list[TraceRequest] = []
    first_ms: int | None = None
    last_ms = None
    for lineno, obj in iter_json_lines(path):
        if not isinstance(obj, dict):
            raise TraceFormatError(path, f"line {lineno}", "expected a JSON object")
        ts = _int_field(path, lineno, obj, "timestamp", 0, int(MAX_TIMESTAMP))
        n_in = _int_field(path, lineno, obj, "input_length", 1, MAX_TOKENS)
        n_out = _int_field(path, lineno, obj, "output_length", 1, MAX_TOKENS)
        hash_ids = obj.get("hash_ids")
        if not isinstance(hash_ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and 0 <= h <= MAX_SEGMENT_KEY
            for h in hash_ids
        ):
            raise TraceFormatError(
                path,
                f"line {lineno}",
                f"field 'hash_ids': expected a list of integers in [0, {MAX_SEGMENT_KEY}]",
            )
        need = -(-n_in // block_tokens)
        if len(hash_ids) < need:
            raise TraceFormatError(
                path,
                f"line {lineno}",
                f"input_length {n_in} needs {need} hash ids of {block_tokens}-token "
                f"blocks, got {len(hash_ids)}",
            )
        if last_ms is not None and ts < last_ms:
            raise TraceFormatError(
                path,
                f"line {lineno}",
                f"timestamp {ts} is before the previous one ({last_ms}); "
                "expected non-decreasing timestamps",
            )
        last_ms = ts
        if first_ms is None:
            first_ms = ts
        if ts - first_ms > MAX_SECONDS * 1000:
            raise TraceFormatError(
                path,
                f"line {lineno}",
                f"timestamp {ts} is {(ts - first_ms) / 1000:g} s after the first; "
                f"expected a trace shorter than {MAX_SECONDS:g} s",
            )
        segments = [(h, block_tokens) for h in hash_ids[: need - 1]]
        segments.append((hash_ids[need - 1], n_in - block_tokens * (need - 1)))
        requests.append(
            TraceRequest(
                request_id=f"mc{len(requests)}",
                prompt_len=n_in,
                output_len=n_out,
                arrival_time=(ts - first_ms) / 1000.0,
                prompt_segments=tuple(segments),
            )
        )
    return Trace(name=path.stem, requests=tuple(requests), seed=seed, source=str(path))
