"""Replay a measured run through the simulator and compare it request by request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slotune.engine.sim.profile import GpuProfile
from slotune.engine.sim.stack import StackProfile, load_stack
from slotune.validate.runs import MeasuredRun
from slotune.workloads.metrics import request_metrics

METRICS = ("ttft", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class Replay:
    """Predicted and measured per-request seconds of one run (NaN where either failed)."""

    run: MeasuredRun
    predicted: dict[str, np.ndarray]
    measured: dict[str, np.ndarray]
    stack: str
    profile: str

    def stats(self, window: tuple[float, float] | None = None) -> dict[str, dict[str, float]]:
        """``{metric: {"pred_mean": …, "meas_mean": …, "err_mean": …, …}}``, errors as
        ``predicted / measured − 1``; ``window`` keeps requests arriving inside it."""
        keep = np.isfinite(self.predicted["e2e"]) & np.isfinite(self.measured["e2e"])
        if window is not None:
            a = self.run.arrivals
            keep &= (a >= window[0]) & (a < window[1])
        out: dict[str, dict[str, float]] = {}
        for m in METRICS:
            p, q = self.predicted[m][keep], self.measured[m][keep]
            row: dict[str, float] = {}
            for s in STATS:
                pv, qv = _stat(p, s), _stat(q, s)
                row[f"pred_{s}"], row[f"meas_{s}"] = pv, qv
                row[f"err_{s}"] = pv / qv - 1 if qv > 0 else float("nan")
            out[m] = row
        out["requests"] = {
            "count": float(keep.sum()),
            "failed_pred": float((~np.isfinite(self.predicted["e2e"])).sum()),
        }
        return out

    def throughputs(self, window: tuple[float, float] | None = None) -> tuple[float, float]:
        """Predicted and measured output tokens per second of the requests arriving in
        ``window`` (or all), over the span from their first arrival to their last finish."""
        a = self.run.arrivals
        keep = np.isfinite(self.measured["e2e"])
        if window is not None:
            keep &= (a >= window[0]) & (a < window[1])
        tokens = float(self.run.output_lens[keep].sum())
        out = []
        for e2e in (self.predicted["e2e"], self.measured["e2e"]):
            done = np.where(np.isfinite(e2e), a + e2e, np.inf)[keep]
            span = float(done.max() - a[keep].min()) if keep.any() else 0.0
            out.append(tokens / span if 0 < span < np.inf else float("nan"))
        return out[0], out[1]

    def saturated(self) -> bool:
        """Whether the replay queued without bound where the real server did not: the
        predicted TTFT of the last tenth of the requests of a stage over 10× the measured
        one and over a second."""
        a = self.run.arrivals
        for lo, hi in self.run.stages or ((0.0, float(a.max()) + 1.0),):
            inside = np.flatnonzero((a >= lo) & (a < hi))
            tail = inside[len(inside) * 9 // 10 :]
            if len(tail) == 0:
                continue
            pred = (
                np.nanmean(self.predicted["ttft"][tail])
                if np.isfinite(self.predicted["ttft"][tail]).any()
                else np.inf
            )
            meas = np.nanmean(self.measured["ttft"][tail])
            if pred > max(10 * meas, 1.0):
                return True
        return False


def _stat(x: np.ndarray, s: str) -> float:
    if len(x) == 0:
        return float("nan")
    return float(np.mean(x)) if s == "mean" else float(np.percentile(x, float(s[1:])))


def per_request(
    ttft: np.ndarray, e2e: np.ndarray, output_lens: np.ndarray
) -> dict[str, np.ndarray]:
    with np.errstate(divide="ignore", invalid="ignore"):
        itl = np.where(output_lens > 1, (e2e - ttft) / (output_lens - 1), np.nan)
    return {"ttft": ttft, "e2e": e2e, "itl": itl}


def replay(
    run: MeasuredRun,
    *,
    gpu: str | None = None,
    stack: str | StackProfile | None = None,
    profile: GpuProfile | None = None,
) -> Replay:
    """Simulate ``run`` with its own settings and arrival times on ``profile`` (or the
    shipped profile of ``gpu``, or of the run's GPU) and ``stack`` (default: vLLM V1)."""
    stack = stack if isinstance(stack, StackProfile) else load_stack(stack)
    from slotune.engine.config import EngineConfig
    from slotune.workloads.arrivals import ArrivalSpec
    from slotune.workloads.backends import SimBackend
    from slotune.workloads.backends import run as run_workload

    s = run.settings
    config = EngineConfig(
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_num_seqs=s.max_num_seqs,
        block_size=s.block_size,
        max_model_len=s.max_model_len,
        prefix_caching=s.prefix_caching,  # type: ignore[arg-type]
        num_gpu_blocks=s.num_gpu_blocks,
    )
    backend = SimBackend(gpu=profile or gpu or s.gpu, model=s.model, tp=s.tp, stack=stack)
    result = run_workload(backend, run.trace, ArrivalSpec(timestamps=True), config)
    metrics = request_metrics(result)
    ttft, e2e = metrics["ttft"], metrics["e2e"]
    outs = run.output_lens
    return Replay(
        run=run,
        predicted=per_request(ttft, e2e, outs),
        measured=per_request(run.ttft_s, run.e2e_s, outs),
        stack=stack.name,
        profile=profile.source if profile else (gpu or s.gpu),
    )
