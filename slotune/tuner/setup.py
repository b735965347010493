"""What a tuning study measures, stored in the study so that every worker and every
``--resume`` rebuilds exactly the same experiment from the storage alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

SETUP_ATTR = "slotune_setup"
BASELINE_ATTR = "slotune_baseline"
RUN_ATTR = "slotune_run"
"""The study's run settings: ``trials`` (the global budget its creator asked for) and
``heartbeat`` (seconds between a worker's heartbeats)."""


@dataclass(frozen=True)
class LoadSpec:
    """The offered load of a run: an open-loop ``rate``, a closed loop of ``concurrency``
    users, the trace's own ``timestamps`` (at ``native_rate`` req/s), or all at once."""

    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None
    timestamps: bool = False
    native_rate: float | None = None
    duration_s: float | None = None  # send for this long at the rate (the trace repeated)

    def arrivals(self, rate: float | None = None) -> Any:
        """The runner's ``ArrivalSpec``; ``rate`` overrides the load (the goodput search).

        On a timestamped trace a rate scales the timestamps (``time_scale = native / rate``).
        """
        from slotune.workloads import ArrivalSpec

        rate = self.rate if rate is None else rate
        if self.timestamps:
            scale = 1.0 if rate is None or not self.native_rate else self.native_rate / rate
            return ArrivalSpec(timestamps=True, time_scale=scale, concurrency=self.concurrency)
        burstiness = self.burstiness if rate is not None else 1.0
        if self.duration_s is not None and rate is not None:
            from slotune.workloads import Stage

            stages = (Stage(rate, self.duration_s),)
            return ArrivalSpec(stages=stages, burstiness=burstiness, concurrency=self.concurrency)
        return ArrivalSpec(rate=rate, burstiness=burstiness, concurrency=self.concurrency)

    def describe(self) -> str:
        if self.timestamps:
            if self.rate is not None and self.native_rate:
                return f"trace timestamps scaled to {self.rate:.3g} req/s"
            return "trace timestamps"
        if self.concurrency is not None and self.rate is None:
            return f"closed loop, {self.concurrency} users"
        if self.rate is None:
            return "all requests at once"
        kind = "Poisson" if self.burstiness == 1 else f"gamma (burstiness {self.burstiness:g})"
        length = "" if self.duration_s is None else f" for {self.duration_s:g} s"
        return f"{kind} at {self.rate:.3g} req/s{length}"


@dataclass(frozen=True)
class TuneSetup:
    """Everything that defines a study's measurements (not how many trials or workers)."""

    gpu: str
    model: str
    slo: str
    objective: str
    weights: dict[str, float]
    percentile: float
    attainment: float
    space: dict[str, Any]
    load: LoadSpec
    tp: int = 1
    backend: str = "sim"
    stack: str = "vllm-v1"
    trace: str = "sharegpt-like"
    trace_format: str | None = None
    num_requests: int | None = None
    request_timeout_s: float | None = None  # the client gives up on a request (a failure)
    warmup_s: float = 0.0  # scores leave out requests arriving this early...
    cooldown_s: float = 0.0  # ...or this close to the last arrival
    seed: int = 0
    sampler: str = "tpe"
    ladder: dict[str, float] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    trace_digest: str | None = None
    quantization: str | None = None  # the model's weight format, given (sim)
    ep: int = 1  # expert-parallel GPUs of a MoE model (sim)
    target: str = "slotune"  # the engine release recommended for (older studies: every knob)
    tier_objective: str | None = None  # ``pro>=0.99,free=1``: tier floors and weights

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneSetup:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["load"] = LoadSpec(**kwargs["load"])
        kwargs["notes"] = tuple(kwargs.get("notes", ()))
        return cls(**kwargs)

    def differences(self, other: TuneSetup) -> list[str]:
        """Fields (besides the sampler and notes) on which two setups disagree. Two traces
        with the same digest are the same requests, wherever their files are."""
        skip = {"sampler", "notes", "load", "ladder", "trace_digest"}
        if self.trace_digest and other.trace_digest:
            skip.add("trace")
            if self.trace_digest != other.trace_digest:
                skip.add("num_requests")  # another trace says it better than its length
        out = [
            f.name
            for f in fields(self)
            if f.name not in skip and getattr(self, f.name) != getattr(other, f.name)
        ]
        mine, theirs = self.load, other.load
        for f in fields(LoadSpec):
            if f.name in ("native_rate",):
                continue
            a, b = getattr(mine, f.name), getattr(theirs, f.name)
            if f.name == "rate" and (a is None or b is None):
                continue
            if a != b:
                out.append(f"load.{f.name}")
        if self.trace_digest and other.trace_digest and self.trace_digest != other.trace_digest:
            out.insert(0, "trace")
        return out

    def explain_differences(self, other: TuneSetup) -> str:
        """``field (study: A; here: B)`` for each difference, ``self`` being the study's."""
        parts = []
        for name in self.differences(other):
            if name == "trace":
                mine, theirs = _trace_text(self), _trace_text(other)
            elif name == "space":
                mine, theirs = "another search space", "this one"
            else:
                mine, theirs = _field(self, name), _field(other, name)
            label = "search space" if name == "space" else name
            parts.append(f"{label} (study: {mine}; here: {theirs})")
        return ", ".join(parts)


def _field(setup: TuneSetup, name: str) -> Any:
    value: Any = setup
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _trace_text(setup: TuneSetup) -> str:
    digest = f" digest {setup.trace_digest[:12]}" if setup.trace_digest else ""
    return f"{setup.trace} ({setup.num_requests} requests{digest})"


def trace_digest(trace: Any) -> str:
    """SHA-256 of a trace's requests as stored (ids, lengths, times, tokens, sessions)."""
    import hashlib
    import json

    rows = [r.to_json() for r in trace.requests]
    text = json.dumps({"seed": trace.seed, "requests": rows}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
