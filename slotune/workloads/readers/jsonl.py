"""slotune's own JSONL: an optional header line, then one normalized request per line."""

from __future__ import annotations

from pathlib import Path

from slotune.workloads.limits import MAX_TOKENS, check_int
from slotune.workloads.readers.errors import TraceFormatError, at, iter_json_lines
from slotune.workloads.tokenizer import Tokenizer
from slotune.workloads.trace import Trace, TraceRequest, request_from_json


def read_slotune_jsonl(path: Path, tokenizer: Tokenizer, default_seed: int) -> Trace:
    """The header's seed (if any) fixes synthetic tokens; otherwise ``default_seed``."""
    dropped: dict[str, int]
    name, trace_seed, dropped, source = path.stem, default_seed, {}, ""
    requests: list[TraceRequest] = []
    seen: set[str] = set()
    last_arrival = 0.0
    used_text = False
    for lineno, obj in iter_json_lines(path):
        if isinstance(obj, dict) and "slotune_trace" in obj:
            with at(path, f"line {lineno}"):
                name, trace_seed, dropped, source = _header(obj, name, default_seed)
            continue
        with at(path, f"line {lineno}"):
            req = request_from_json(obj, tokenizer)
        if req.parent_id is not None and req.parent_id not in seen:
            raise TraceFormatError(
                path,
                f"line {lineno}",
                f"parent_id {req.parent_id!r} is not an earlier request; "
                "a turn must come after the turn it continues",
            )
        if req.parent_id is None and req.arrival_time is not None:
            if req.arrival_time < last_arrival:
                raise TraceFormatError(
                    path,
                    f"line {lineno}",
                    f"arrival_time {req.arrival_time} is before the previous one "
                    f"({last_arrival}); expected non-decreasing arrival times",
                )
            last_arrival = req.arrival_time
        if req.request_id in seen:
            raise TraceFormatError(path, f"line {lineno}", f"duplicate id {req.request_id!r}")
        seen.add(req.request_id)
        used_text = used_text or req.prompt_text is not None
        requests.append(req)
    return Trace(
        name=name,
        requests=tuple(requests),
        seed=trace_seed,
        dropped=dropped,
        source=source or str(path),
        tokenizer=tokenizer.name if used_text else "",
    )


def _header(obj: dict, name: str, default_seed: int) -> tuple[str, int, dict[str, int], str]:
    seed = check_int(obj.get("seed", default_seed), "header field 'seed'", maximum=2**63 - 1)
    dropped = obj.get("dropped", {})
    if not isinstance(dropped, dict):
        raise ValueError(f"header field 'dropped': expected an object, got {dropped!r}")
    counts = {
        str(k): check_int(v, f"header field 'dropped'[{k!r}]", maximum=MAX_TOKENS)
        for k, v in dropped.items()
    }
    return str(obj.get("name", name)), seed, counts, str(obj.get("source", ""))
