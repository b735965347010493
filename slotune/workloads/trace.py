"""The normalized trace every reader and generator produces.

A request's prompt is given one of four ways: token ids, text (tokenized on load, the
text kept for HTTP targets), segments, or only a length. Segments are ``(key, length)``
pairs: a segment's tokens depend only on its key (the first ``length`` tokens of the
key's stream), so equal keys are equal tokens across requests. That is how Mooncake's
``hash_ids`` and the generators' shared system prompts become real shared prefixes. A
length-only prompt gets tokens unique to the request.

A session turn with ``parent_id`` continues that earlier turn: its prompt fields hold only
what the turn appends (tool result, next user message). The runner sends the parent's full
prompt, then the parent's actual output, then these tokens, so a follow-up turn shares
its whole history with the prefix cache, as a real chat or agent does.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from slotune.workloads.limits import (
    MAX_SECONDS,
    MAX_SEGMENT_KEY,
    MAX_TOKEN_ID,
    MAX_TOKENS,
    check_int,
    check_priority,
    check_seconds,
    check_tier,
)
from slotune.workloads.tokenizer import Tokenizer

TOKEN_ID_LOW = 32  # synthetic ids are printable ASCII so byte-level decoding gives text
TOKEN_ID_HIGH = 127
_KIND_SEGMENT, _KIND_REQUEST, _KIND_OUTPUT = 0, 1, 2
STATS_BLOCK_SIZE = 16


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace. Times are seconds from the start of the trace.

    ``priority`` (lower first, vLLM's convention) orders it under priority scheduling;
    ``tier`` is its service tier, 0 the highest (pro), 1 and up below it (free).
    """

    request_id: str
    prompt_len: int
    output_len: int
    arrival_time: float | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    prompt_segments: tuple[tuple[int, int], ...] | None = None
    session_id: str | None = None
    turn: int = 0
    think_time_s: float = 0.0
    parent_id: str | None = None
    priority: int = 0
    tier: int = 0

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("request id must be a non-empty string")
        if self.priority or self.tier:  # 0 for most requests: skip the checks there
            if isinstance(self.priority, bool) or not isinstance(self.priority, int):
                raise ValueError(f"priority must be an integer (got {self.priority!r})")
            check_priority(self.priority)
            if isinstance(self.tier, bool) or not isinstance(self.tier, int):
                raise ValueError(f"tier must be an integer (got {self.tier!r})")
            check_tier(self.tier)
        if isinstance(self.prompt_len, bool) or not isinstance(self.prompt_len, int):
            raise ValueError(f"prompt length must be an integer (got {self.prompt_len!r})")
        if isinstance(self.output_len, bool) or not isinstance(self.output_len, int):
            raise ValueError(f"output length must be an integer (got {self.output_len!r})")
        if self.prompt_len < 1:
            raise ValueError(f"prompt length must be at least 1 token (got {self.prompt_len})")
        if self.output_len < 1:
            raise ValueError(f"output length must be at least 1 token (got {self.output_len})")
        if max(self.prompt_len, self.output_len) > MAX_TOKENS:
            raise ValueError(
                f"prompt and output lengths must be at most {MAX_TOKENS} tokens "
                f"(got {self.prompt_len} and {self.output_len})"
            )
        if self.arrival_time is not None and not 0 <= self.arrival_time <= MAX_SECONDS:
            raise ValueError(
                f"arrival time must be in [0, {MAX_SECONDS:g}] seconds (got {self.arrival_time})"
            )
        if not 0 <= self.think_time_s <= MAX_SECONDS:
            raise ValueError(
                f"think time must be in [0, {MAX_SECONDS:g}] seconds (got {self.think_time_s})"
            )
        if self.turn < 0:
            raise ValueError(f"turn index must be >= 0 (got {self.turn})")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise ValueError(
                f"prompt_len {self.prompt_len} differs from the {len(self.prompt_token_ids)} "
                "prompt token ids"
            )
        if self.prompt_segments is not None:
            if any(k < 0 or n < 1 for k, n in self.prompt_segments):
                raise ValueError("segments must be [key >= 0, length >= 1] pairs")
            total = sum(n for _, n in self.prompt_segments)
            if total != self.prompt_len:
                raise ValueError(
                    f"prompt_len {self.prompt_len} differs from the segments' {total} tokens"
                )
        if self.parent_id is not None and self.parent_id == self.request_id:
            raise ValueError("a turn cannot continue itself (parent_id == id)")

    def to_json(self) -> dict[str, Any]:
        """The slotune JSONL form: defaults and empty fields left out."""
        out: dict[str, Any] = {"id": self.request_id}
        if self.arrival_time is not None:
            out["arrival_time"] = round(self.arrival_time, 6)
        out["prompt_len"] = self.prompt_len
        out["output_len"] = self.output_len
        if self.prompt_text is not None:
            out["prompt"] = self.prompt_text
        elif self.prompt_token_ids is not None:
            out["prompt_token_ids"] = list(self.prompt_token_ids)
        if self.prompt_segments is not None:
            out["segments"] = [list(s) for s in self.prompt_segments]
        if self.session_id is not None:
            out["session_id"] = self.session_id
            out["turn"] = self.turn
        if self.think_time_s:
            out["think_time_s"] = round(self.think_time_s, 6)
        if self.parent_id is not None:
            out["parent_id"] = self.parent_id
        if self.priority:
            out["priority"] = self.priority
        if self.tier:
            out["tier"] = self.tier
        return out


@dataclass(frozen=True)
class Trace:
    """Requests in trace order (a turn always after the turn it continues).

    ``dropped`` counts the rows readers filtered out, by reason; ``seed`` fixes the tokens
    of segment and length-only prompts.
    """

    name: str
    requests: tuple[TraceRequest, ...]
    seed: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    source: str = ""
    tokenizer: str = ""
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for r in self.requests:
            if r.request_id in seen:
                raise ValueError(f"trace {self.name}: duplicate request id {r.request_id!r}")
            if r.parent_id is not None and r.parent_id not in seen:
                raise ValueError(
                    f"trace {self.name}: request {r.request_id!r} continues {r.parent_id!r}, "
                    "which is not an earlier request of the trace"
                )
            seen.add(r.request_id)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[TraceRequest]:
        return iter(self.requests)

    @property
    def has_timestamps(self) -> bool:
        """Whether every request that starts a session (no parent) has an arrival time."""
        roots = [r for r in self.requests if r.parent_id is None]
        return bool(roots) and all(r.arrival_time is not None for r in roots)

    @property
    def requests_per_session(self) -> float:
        """Requests per session (a request without a parent and the turns that continue
        it): 1 for a trace of single requests."""
        roots = sum(1 for r in self.requests if r.parent_id is None)
        return len(self.requests) / roots if roots else 1.0

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())

    def head(self, num_requests: int | None) -> Trace:
        """The first ``num_requests`` requests; an error if the trace has fewer."""
        if num_requests is None:
            return self
        if num_requests < 1:
            raise ValueError(f"num_requests must be at least 1 (got {num_requests})")
        if num_requests > len(self.requests):
            raise ValueError(
                f"trace {self.name} has only {len(self.requests)} requests"
                + (f" after filters ({self.num_dropped} dropped)" if self.dropped else "")
                + f"; asked for {num_requests}"
            )
        return replace(self, requests=self.requests[:num_requests], _cache={})

    def repeat_to(self, num_sessions: int) -> Trace:
        """A trace of exactly ``num_sessions`` sessions (a request without a parent and the
        turns that continue it): the first ones, or the whole trace again and again (ids
        ``<id>~1``, ``<id>~2``...) when it has fewer. Repeats send the same prompts, as a
        replayed sample does: text and token-id prompts hit the prefix cache the second
        time; length-only prompts get tokens of their own."""
        if num_sessions < 1:
            raise ValueError(f"num_sessions must be at least 1 (got {num_sessions})")
        flow_of: dict[str, int] = {}
        flows: list[list[TraceRequest]] = []
        for r in self.requests:
            if r.parent_id is None:
                flow_of[r.request_id] = len(flows)
                flows.append([r])
            else:
                flow_of[r.request_id] = flow_of[r.parent_id]
                flows[flow_of[r.request_id]].append(r)
        if not flows:
            raise ValueError(f"trace {self.name} has no requests to repeat")
        out: list[TraceRequest] = []
        for k in range(num_sessions):
            copy, f = divmod(k, len(flows))
            out.extend(r if copy == 0 else _renamed(r, f"~{copy}") for r in flows[f])
        if num_sessions <= len(flows):  # keep trace order when only cutting
            keep = {r.request_id for r in out}
            out = [r for r in self.requests if r.request_id in keep]
        return replace(self, requests=tuple(out), _cache={})

    def own_prompt_token_ids(self) -> list[list[int]]:
        """Each request's own prompt tokens (for a continuing turn, what it appends).

        Computed once per trace and cached: the tuner runs the same trace many times.
        """
        cached = self._cache.get("prompts")
        if cached is None:
            cached = _materialize(self)
            self._cache["prompts"] = cached
        return cached

    def prompts_checked(self) -> list[bool]:
        """Whether each request's own prompt tokens are known to be non-negative integers
        (what an engine checks of every prompt): drawn ones are by construction, given
        ids are checked once for the whole trace (if any is not, none counts as checked,
        and the engine checks and rejects each as usual)."""
        cached = self._cache.get("checked")
        if cached is None:
            given = [r.prompt_token_ids is not None for r in self.requests]
            ok = True
            if any(given):
                ids = self.own_prompt_token_ids()
                try:  # C-speed, as the engine's own check
                    array("Q", chain.from_iterable(p for p, g in zip(ids, given, strict=True) if g))
                except (TypeError, OverflowError):
                    ok = False
            cached = self._cache["checked"] = [ok or not g for g in given]
        return cached

    def full_prompt_lengths(self) -> list[int]:
        """Prompt lengths the engine will see, counting each parent's expected output."""
        index = {r.request_id: i for i, r in enumerate(self.requests)}
        full: list[int] = []
        for r in self.requests:
            if r.parent_id is None:
                full.append(r.prompt_len)
            else:
                p = index[r.parent_id]
                full.append(full[p] + self.requests[p].output_len + r.prompt_len)
        return full

    def stats(self) -> dict[str, Any]:
        """Counts, length percentiles and the prefix-sharing ratio.

        ``prefix_sharing_ratio``: the share of prompt tokens in full 16-token blocks that
        an earlier request's prompt already holds (what an unbounded prefix cache could
        serve). Parents' outputs are counted as unique tokens of their expected length.
        """
        cached = self._cache.get("stats")
        if cached is None:
            cached = self._cache["stats"] = self._stats()
        return json.loads(json.dumps(cached))

    def _stats(self) -> dict[str, Any]:
        reqs = self.requests
        sessions = {r.session_id for r in reqs if r.session_id is not None}
        full = np.asarray(self.full_prompt_lengths() or [0], dtype=float)
        out = np.asarray([r.output_len for r in reqs] or [0], dtype=float)
        stats: dict[str, Any] = {
            "name": self.name,
            "requests": len(reqs),
            "sessions": len(sessions),
            "turns_per_session": round(sum(1 for r in reqs if r.session_id) / len(sessions), 2)
            if sessions
            else 0.0,
            "prompt_len": _percentiles(full),
            "output_len": _percentiles(out),
            "total_prompt_tokens": int(full.sum()) if reqs else 0,
            "total_output_tokens": int(out.sum()) if reqs else 0,
            "prefix_sharing_ratio": round(_prefix_sharing_ratio(self), 4),
            "has_timestamps": self.has_timestamps,
            "dropped": dict(self.dropped),
        }
        if self.has_timestamps and reqs:
            times = [r.arrival_time for r in reqs if r.arrival_time is not None]
            span = max(times) - min(times)
            stats["timestamp_span_s"] = round(span, 3)
            stats["mean_rate"] = round((len(times) - 1) / span, 3) if span > 0 else None
        if self.tokenizer:
            stats["tokenizer"] = self.tokenizer
        return stats

    def to_jsonl(self, path: str | Path) -> None:
        """Write slotune's own JSONL: a header line with the trace's metadata, then requests."""
        header = {"slotune_trace": 1, "name": self.name, "seed": self.seed}
        if self.dropped:
            header["dropped"] = self.dropped
        if self.source:
            header["source"] = self.source
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
            for r in self.requests:
                f.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")


def default_max_model_len(trace: Trace) -> int:
    """``max_model_len`` when none is given: the trace's longest request (its prompt with
    the session's history, plus its output), at least 16 tokens."""
    full = trace.full_prompt_lengths()
    longest = max(p + r.output_len for p, r in zip(full, trace.requests, strict=True))
    return max(longest, 16)


def _renamed(r: TraceRequest, suffix: str) -> TraceRequest:
    return replace(
        r,
        request_id=r.request_id + suffix,
        session_id=None if r.session_id is None else r.session_id + suffix,
        parent_id=None if r.parent_id is None else r.parent_id + suffix,
    )


def synthetic_tokens(seed: int, kind: int, key: int, n: int) -> list[int]:
    rng = np.random.default_rng([seed, kind, key])
    # int32 draws the same numbers as the default int64 (one 32-bit word each), faster
    return rng.integers(TOKEN_ID_LOW, TOKEN_ID_HIGH, size=n, dtype=np.int32).tolist()


def output_placeholder_tokens(seed: int, index: int, n: int) -> list[int]:
    """Stand-in tokens for a parent's output where the real output is not known (stats)."""
    return synthetic_tokens(seed, _KIND_OUTPUT, index, n)


def _materialize(trace: Trace) -> list[list[int]]:
    longest: dict[int, int] = {}
    for r in trace.requests:
        if r.prompt_token_ids is None and r.prompt_segments is not None:
            for key, n in r.prompt_segments:
                longest[key] = max(longest.get(key, 0), n)
    streams = {k: synthetic_tokens(trace.seed, _KIND_SEGMENT, k, n) for k, n in longest.items()}
    prompts: list[list[int]] = []
    for i, r in enumerate(trace.requests):
        if r.prompt_token_ids is not None:
            prompts.append(list(r.prompt_token_ids))
        elif r.prompt_segments is not None:
            ids: list[int] = []
            for key, n in r.prompt_segments:
                ids.extend(streams[key][:n])
            prompts.append(ids)
        else:
            prompts.append(synthetic_tokens(trace.seed, _KIND_REQUEST, i, r.prompt_len))
    return prompts


def _prefix_sharing_ratio(trace: Trace) -> float:
    reqs = trace.requests
    if "prompts" not in trace._cache and all(
        r.prompt_token_ids is None
        and r.prompt_segments is None
        and r.session_id is None
        and r.parent_id is None
        for r in reqs
    ):
        return 0.0  # length-only prompts are unique by construction; skip materializing
    own = trace.own_prompt_token_ids()
    index = {r.request_id: i for i, r in enumerate(trace.requests)}
    full: list[list[int]] = []
    seen: set[int] = set()
    hit = total = 0
    bs = STATS_BLOCK_SIZE
    for i, r in enumerate(trace.requests):
        if r.parent_id is None:
            ids = own[i]
        else:
            p = index[r.parent_id]
            out = output_placeholder_tokens(trace.seed, p, trace.requests[p].output_len)
            ids = full[p] + out + own[i]
        full.append(ids)
        total += len(ids)
        h = 0
        for start in range(0, len(ids) - bs + 1, bs):
            h = hash((h, *ids[start : start + bs]))
            if h in seen:
                hit += bs
            else:
                seen.add(h)
    return hit / total if total else 0.0


def _percentiles(values: np.ndarray) -> dict[str, float]:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean": round(float(values.mean()), 1),
        "p50": round(float(p50), 1),
        "p90": round(float(p90), 1),
        "p99": round(float(p99), 1),
        "max": round(float(values.max()), 1),
    }


def request_from_json(obj: Any, tokenizer: Tokenizer) -> TraceRequest:
    """Build a request from one slotune JSONL object; ValueError says what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    known = {
        "id",
        "arrival_time",
        "prompt_len",
        "output_len",
        "prompt",
        "prompt_token_ids",
        "segments",
        "session_id",
        "turn",
        "think_time_s",
        "parent_id",
        "priority",
        "tier",
    }
    unknown = sorted(set(obj) - known)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; known: {sorted(known)}")
    for key in ("id", "output_len"):
        if key not in obj:
            raise ValueError(f"missing field {key!r}")
    ids = obj.get("prompt_token_ids")
    segments = obj.get("segments")
    if ids is not None:
        if not isinstance(ids, list):
            raise ValueError("prompt_token_ids must be a list of integers")
        ids = [check_int(t, "prompt_token_ids", maximum=MAX_TOKEN_ID) for t in ids]
    if segments is not None:
        if not isinstance(segments, list) or not all(
            isinstance(s, list) and len(s) == 2 for s in segments
        ):
            raise ValueError("segments must be a list of [key, length] integer pairs")
        segments = tuple(
            (
                check_int(k, "segment key", maximum=MAX_SEGMENT_KEY),
                check_int(n, "segment length", minimum=1),
            )
            for k, n in segments
        )
    text = obj.get("prompt")
    if text is not None and not isinstance(text, str):
        raise ValueError("prompt must be a string (token ids go in prompt_token_ids)")
    if text is not None and ids is None:
        ids = tokenizer.encode(text)
        if not ids:
            raise ValueError("prompt is empty")
    prompt_len = obj.get("prompt_len")
    if text is not None or prompt_len is None:
        if ids is not None:
            prompt_len = len(ids)
        elif segments is not None:
            prompt_len = sum(n for _, n in segments)
        else:
            raise ValueError("missing field 'prompt_len' (or prompt_token_ids / segments)")
    arrival = obj.get("arrival_time")
    session = obj.get("session_id")
    parent = obj.get("parent_id")
    return TraceRequest(
        request_id=str(obj["id"]),
        prompt_len=check_int(prompt_len, "prompt_len", minimum=1),
        output_len=check_int(obj["output_len"], "output_len", minimum=1),
        arrival_time=None if arrival is None else check_seconds(arrival, "arrival_time"),
        prompt_token_ids=None if ids is None else tuple(ids),
        prompt_text=obj.get("prompt"),
        prompt_segments=segments,
        session_id=None if session is None else str(session),
        turn=check_int(obj.get("turn", 0), "turn"),
        think_time_s=check_seconds(obj.get("think_time_s", 0.0), "think_time_s"),
        parent_id=None if parent is None else str(parent),
        priority=check_priority(obj.get("priority", 0)),
        tier=check_tier(obj.get("tier", 0)),
    )
