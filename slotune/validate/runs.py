"""Measured serving runs: what a real server was sent and what each request measured.

A ``MeasuredRun`` holds the replayable trace (arrival times, prompt lengths with their
shared prefixes, output lengths), the server settings the run used, and the measured
TTFT and E2E of each request. Two layouts are read:

- inference-perf runs as the BLIS sim-to-real study publishes them: a folder with
  ``requests.json`` (settings and requests), ``measured.json`` (per-request TTFT/E2E) and
  ``profile.json`` (the workload, whose ``output_len`` is what vLLM decoded under
  ``ignore_eos``); the model's ``config.json`` is looked up in ``model_configs/`` beside the
  run folders;
- the output folder of ``slotune bench`` (``requests.csv`` and ``summary.json``), for
  example one run against a real server with ``--backend http``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from slotune.engine.config import EngineConfig
from slotune.workloads.trace import Trace, TraceRequest

_ENGINE = EngineConfig()  # the engine's defaults stand for a setting a run does not record


class RunFormatError(ValueError):
    """A measured run that cannot be read: the message names the file and the problem."""


@dataclass(frozen=True)
class ServerSettings:
    """The engine settings of a measured run (what the replay must use)."""

    model: str
    tp: int = 1
    max_num_seqs: int = _ENGINE.max_num_seqs
    max_num_batched_tokens: int = _ENGINE.max_num_batched_tokens
    block_size: int = _ENGINE.block_size
    max_model_len: int = 4096
    num_gpu_blocks: int | None = None
    prefix_caching: str = "hash"
    gpu: str = "h100"


@dataclass(frozen=True)
class MeasuredRun:
    """``ttft_s``/``e2e_s``: measured per request of ``trace`` (NaN where it failed);
    ``ok`` marks the requests that succeeded. ``stages`` are ``(start_s, end_s)`` windows
    of the load, for per-stage errors."""

    name: str
    trace: Trace
    settings: ServerSettings
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    ok: np.ndarray
    stages: tuple[tuple[float, float], ...] = ()
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def output_lens(self) -> np.ndarray:
        return np.array([r.output_len for r in self.trace.requests], dtype=float)

    @property
    def arrivals(self) -> np.ndarray:
        return np.array([r.arrival_time or 0.0 for r in self.trace.requests], dtype=float)


def load_run(path: str | Path, *, gpu: str | None = None, model: str | None = None) -> MeasuredRun:
    """Read a measured run folder of either layout (see the module docstring)."""
    d = Path(path)
    if not d.is_dir():
        raise RunFormatError(f"{d}: not a folder (a measured run is a folder)")
    if (d / "requests.json").is_file() and (d / "measured.json").is_file():
        return _load_inference_perf(d, gpu=gpu, model=model)
    if (d / "requests.csv").is_file():
        return _load_bench_output(d, gpu=gpu, model=model)
    raise RunFormatError(
        f"{d}: not a measured run (expected requests.json + measured.json, or the "
        "requests.csv + summary.json of slotune bench)"
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RunFormatError(f"{path}: cannot read JSON ({e})") from None


def _need(obj: dict[str, Any], key: str, where: Path) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise RunFormatError(f"{where}: missing field {key!r}")
    return obj[key]


def _model_config_path(run_dir: Path, model_id: str) -> Path | None:
    name = model_id.rsplit("/", 1)[-1]
    for base in (run_dir, run_dir.parent):
        cand = base / "model_configs" / name / "config.json"
        if cand.is_file():
            return cand
    return None


def _load_inference_perf(d: Path, *, gpu: str | None, model: str | None) -> MeasuredRun:
    req_file, meas_file = d / "requests.json", d / "measured.json"
    data = _read_json(req_file)
    cfg = _need(data, "config", req_file)
    rows = _need(data, "requests", req_file)
    measured = _read_json(meas_file)
    if not isinstance(measured, list):
        raise RunFormatError(f"{meas_file}: expected a list of per-request rows")
    profile = _read_json(d / "profile.json") if (d / "profile.json").is_file() else {}
    shared = profile.get("data", {}).get("shared_prefix", {}) if profile else {}
    output_len = shared.get("output_len")
    system_len = int(shared.get("system_prompt_len", 0) or 0)
    groups = int(shared.get("num_unique_system_prompts", 0) or 0)
    model_id = str(data.get("model_id", ""))
    if model is None:
        cfg_path = _model_config_path(d, model_id)
        if cfg_path is None:
            raise RunFormatError(
                f"{req_file}: model {model_id!r} has no config.json in model_configs/ beside "
                "the run; pass the model (a catalogue name or config.json path)"
            )
        model = str(cfg_path)
    by_index = {int(m["index"]): m for m in measured}
    pool = prompt_pool([_int_field(row, "input_tokens", req_file, i) for i, row in enumerate(rows)])
    reqs, ttft, e2e, ok = [], [], [], []
    for i, row in enumerate(rows):
        where = f"{req_file}: requests[{i}]"
        try:
            idx = int(row["index"])
            arrival = float(row["arrival_time_us"]) / 1e6
            prompt_len = int(row["input_tokens"])
            out_len = int(output_len if output_len else row["output_tokens"])
        except (KeyError, TypeError, ValueError) as e:
            raise RunFormatError(f"{where}: bad or missing field ({e})") from None
        if not (np.isfinite(arrival) and arrival >= 0 and prompt_len >= 1 and out_len >= 1):
            raise RunFormatError(f"{where}: arrival, input_tokens and output length must be >= 0/1")
        # The prompt's key: its slot in the generator's prompt pool where the lengths
        # show one (the same text again, so vLLM's prefix cache holds all of it), else
        # its own; the system prompt of its group shared in front either way.
        prompt_key = groups + (pool[i] if pool[i] >= 0 else len(rows) + i)
        segments: tuple[tuple[int, int], ...] | None = None
        if groups and 0 < system_len < prompt_len:
            group = (pool[i] if pool[i] >= 0 else i) % groups
            segments = ((group, system_len), (prompt_key, prompt_len - system_len))
        elif pool[i] >= 0:
            segments = ((prompt_key, prompt_len),)
        reqs.append(
            TraceRequest(
                request_id=f"r{idx}",
                prompt_len=prompt_len,
                output_len=out_len,
                arrival_time=arrival,
                prompt_segments=segments,
            )
        )
        m = by_index.get(idx)
        good = m is not None and not m.get("has_error") and not row.get("has_error")
        ok.append(good)
        if good and m is not None:
            ttft.append(float(m["ttft_s"]))
            e2e.append(float(m["e2e_s"]))
        else:
            ttft.append(np.nan)
            e2e.append(np.nan)
    stages, t = [], 0.0
    for s in profile.get("load", {}).get("stages", []) if profile else []:
        stages.append((t, t + float(s["duration"])))
        t += float(s["duration"])
    settings = ServerSettings(
        model=model,
        tp=int(cfg.get("tensor_parallelism", 1)),
        max_num_seqs=int(cfg.get("max_num_seqs", _ENGINE.max_num_seqs)),
        max_num_batched_tokens=int(
            cfg.get("max_num_batched_tokens", _ENGINE.max_num_batched_tokens)
        ),
        block_size=int(cfg.get("block_size", _ENGINE.block_size)),
        max_model_len=_exp_max_model_len(d),
        num_gpu_blocks=int(cfg["kv_blocks_total_gpu"]) if cfg.get("kv_blocks_total_gpu") else None,
        gpu=gpu or "h100",
    )
    trace = Trace(name=d.name, requests=tuple(reqs), source=str(d))
    return MeasuredRun(
        name=d.name,
        trace=trace,
        settings=settings,
        ttft_s=np.array(ttft),
        e2e_s=np.array(e2e),
        ok=np.array(ok, dtype=bool),
        stages=tuple(stages),
        source=str(d),
    )


def _int_field(row: Any, key: str, where: Path, i: int) -> int:
    try:
        return int(row[key])
    except (KeyError, TypeError, ValueError) as e:
        raise RunFormatError(f"{where}: requests[{i}]: bad or missing field ({e})") from None


POOL_MATCH = 0.9
"""Share of requests whose prompt length must equal the one a period earlier for the
lengths to count as a repeating prompt pool."""


def prompt_pool(lengths: Sequence[int], max_period: int = 2000) -> list[int]:
    """Each request's slot in a repeating prompt pool, or -1 where it has none.

    Load generators such as inference-perf draw a fixed pool of prompts and send prompt
    ``k mod P`` as request ``k``: the same text again, which a server's prefix cache
    serves without prefill. The study's files record only lengths, so the pool shows as
    lengths that repeat with period ``P`` (the smallest period at which at least
    ``POOL_MATCH`` of them do, where lengths vary enough for that not to be chance). A
    request whose length differs from its slot's usual length (sent out of order) takes
    the nearest slot with its length, else none."""
    n = len(lengths)
    arr = np.asarray(lengths)
    _, counts = np.unique(arr, return_counts=True)
    chance = float(((counts / max(n, 1)) ** 2).sum())  # two random requests' lengths equal
    period = 0
    if chance <= 0.5:
        period = next(
            (
                p
                for p in range(2, min(max_period, n // 3) + 1)
                if (arr[p:] == arr[:-p]).mean() >= POOL_MATCH
            ),
            0,
        )
    if not period:
        return [-1] * n
    usual = [Counter(lengths[s::period]).most_common(1)[0][0] for s in range(period)]
    slots = []
    for i, length in enumerate(lengths):
        slot = i % period
        near = sorted(range(period), key=lambda s: min(abs(s - slot), period - abs(s - slot)))
        slots.append(next((s for s in near[:8] if usual[s] == length), -1))
    return slots


def _exp_max_model_len(d: Path) -> int:
    exp = d / "exp-config.yaml"
    if exp.is_file():
        import yaml

        try:
            data = yaml.safe_load(exp.read_text()) or {}
        except yaml.YAMLError as e:
            raise RunFormatError(f"{exp}: cannot read YAML ({e})") from None
        if isinstance(data, dict) and data.get("max_model_len"):
            return int(data["max_model_len"])
    return 4096


def _load_bench_output(d: Path, *, gpu: str | None, model: str | None) -> MeasuredRun:
    """A ``slotune bench --out DIR`` folder: requests.csv for the per-request times and
    lengths, summary.json for the model, GPU and engine settings where it has them (an
    HTTP run against a real server records none: pass ``model`` and ``gpu``)."""
    from slotune.workloads.metrics import request_metrics
    from slotune.workloads.result import RunResult

    summary_file = d / "summary.json"
    summary = _read_json(summary_file) if summary_file.is_file() else {}
    try:
        result = RunResult.load(d)
    except (OSError, ValueError, KeyError) as e:
        raise RunFormatError(f"{d / 'requests.csv'}: cannot read ({e})") from None
    df = result.requests
    model = model or summary.get("model")
    if not model:
        raise RunFormatError(f"{summary_file}: no model recorded; pass the model")
    metrics = request_metrics(result)
    ok = metrics["ok"] & (np.nan_to_num(metrics["output_tokens"]) >= 1)
    reqs = []
    for i, row in enumerate(df.itertuples(index=False)):
        out_len = int(row.output_tokens) if ok[i] else 1
        prompt = int(row.prompt_tokens) if row.prompt_tokens == row.prompt_tokens else 0
        if prompt < 1:
            raise RunFormatError(f"{d / 'requests.csv'}: row {i + 2}: prompt_tokens < 1")
        reqs.append(
            TraceRequest(
                request_id=str(row.request_id),
                prompt_len=prompt,
                output_len=max(out_len, 1),
                arrival_time=float(row.arrival_time),
            )
        )
    ttft = np.where(ok, metrics["ttft"], np.nan)
    e2e = np.where(ok, metrics["e2e"], np.nan)
    cfg = summary.get("config") or {}
    settings = ServerSettings(
        model=str(model),
        tp=int(summary.get("tp") or 1),
        max_num_seqs=int(cfg.get("max_num_seqs", _ENGINE.max_num_seqs)),
        max_num_batched_tokens=int(
            cfg.get("max_num_batched_tokens", _ENGINE.max_num_batched_tokens)
        ),
        block_size=int(cfg.get("block_size", _ENGINE.block_size)),
        max_model_len=int(cfg.get("max_model_len", 8192)),
        num_gpu_blocks=cfg.get("num_gpu_blocks"),
        prefix_caching=str(cfg.get("prefix_caching", "hash")),
        gpu=gpu or summary.get("gpu") or "h100",
    )
    trace = Trace(name=d.name, requests=tuple(reqs), source=str(d))
    return MeasuredRun(
        name=d.name, trace=trace, settings=settings, ttft_s=ttft, e2e_s=e2e, ok=ok, source=str(d)
    )
