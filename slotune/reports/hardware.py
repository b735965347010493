"""The runs read against the GPU: roofline, bandwidth and compute use, KV memory, bound op.

Each stored run of a simulated GPU is read with the cost model of the run's GPU, model and
configuration (``engine.sim.roofline``): per step its FLOPs and HBM bytes at the step's
recorded duration, and over the run the seconds each op took. A run of slotune's real
engine is read with the same per-op formulas applied to its checkpoint's ``config.json``
and the dtype it ran in, at each step's measured time, against the ceilings the run
recorded (``summary["hardware"]``: the GPU's datasheet, or measured on the CPU); its op
seconds are each op's roofline floor, the rest of the measured time under ``host``. An
HTTP endpoint's runs, or a simulated run of an unknown GPU, get a sentence saying why they
are not read. Each chart comes with one sentence saying what changed between the runs and
why; a chart whose quantity is zero in every run is that sentence alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from slotune.reports.behaviour import bin_steps
from slotune.reports.html import e, figure_block, note, table
from slotune.reports.runs import RunData, prefix_cache_hit_rate
from slotune.reports.style import BUDGET, SLO_LINE, finish, run_color

MAX_ROOFLINE_POINTS = 1500
_GIB = float(1 << 30)
OP_LABELS = {
    "weights": "weights (linear layers)",
    "kv_read": "KV reads (decode attention)",
    "attention": "prefill attention",
    "elementwise": "elementwise",
    "allreduce": "all-reduce / all-to-all",
    "host": "host (not hidden)",
}
MEASURED_HOST = "host and kernels past the floors"
"""A measured run's ``host``: its step time past every op's roofline floor."""


@dataclass(frozen=True)
class RunHardware:
    """One run read against its device. ``steps`` holds the run's ``time``, ``kv_usage``
    and ``preempted`` and ``roofline.RUN_COLUMNS``; ``ops`` the seconds each op took over
    the run (for a real engine: its roofline floor, the rest under ``host``); the ceilings
    are (HBM bytes/s, FLOP/s): ``peak`` as ``ceilings`` says (a datasheet, or measured),
    ``fitted`` the GPU profile's (simulated runs only)."""

    label: str
    steps: pd.DataFrame
    ops: dict[str, float]
    peak: tuple[float, float]
    fitted: tuple[float, float] | None
    kv_capacity_gib: float | None
    prefix_hit_rate: float | None
    has_context: bool
    ceilings: str = "datasheet"
    measured: bool = False

    @property
    def seconds(self) -> float:
        return float(self.steps["step_time"].sum())

    def mbu(self, fitted: bool = False) -> float:
        """Over the run: its bytes over its time against ``peak`` (``fitted``: against the
        fitted ceiling, which a real engine's run does not have: then ``peak``)."""
        bw = (self.fitted if fitted and self.fitted else self.peak)[0]
        s = self.seconds
        return float(self.steps["hbm_bytes"].sum()) / s / bw if s > 0 else 0.0

    def mfu(self, fitted: bool = False) -> float:
        peak = (self.fitted if fitted and self.fitted else self.peak)[1]
        s = self.seconds
        return float(self.steps["flops"].sum()) / s / peak if s > 0 else 0.0

    @property
    def ridge(self) -> float:
        return self.peak[1] / self.peak[0]

    @property
    def bound_op(self) -> str:
        return max(self.ops, key=lambda k: self.ops[k])

    @property
    def peak_name(self) -> str:
        """``measured`` or ``datasheet``: what ``peak`` is."""
        return "measured" if self.ceilings.startswith("measured") else "datasheet"

    def share(self, op: str) -> float:
        total = sum(self.ops.values())
        return self.ops[op] / total if total > 0 else 0.0

    @property
    def preemptions(self) -> int:
        return int(self.steps["preempted"].fillna(0).sum())


def cost_model(settings: dict[str, Any], config: dict[str, Any]) -> tuple[Any, Any]:
    """The cost model a run of ``settings`` (best.json or a bench summary) and ``config``
    (its ``EngineConfig`` as a dict) ran on, and that ``EngineConfig``; ``ValueError``
    saying why there is none."""
    from slotune.engine.config import EngineConfig
    from slotune.engine.sim.cost_model import CostModel
    from slotune.engine.sim.models import get_model
    from slotune.engine.sim.profile import load_profile
    from slotune.engine.sim.stack import load_stack

    backend = settings.get("backend")
    if backend not in (None, "sim") or not settings.get("gpu"):
        where = settings.get("url") or backend or "an unnamed target"
        raise ValueError(
            f"the runs were measured on {where}, not simulated on a named GPU: the cost "
            "model's FLOPs and bytes do not describe them"
        )
    profile = load_profile(str(settings["gpu"]))
    model = get_model(str(settings.get("model")), settings.get("quantization"))
    engine = EngineConfig.from_dict(config) if config else EngineConfig()
    stack = settings.get("stack") or profile.stack or None
    return CostModel(
        profile,
        model,
        int(settings.get("tp") or 1),
        engine.block_size,
        load_stack(stack),
        engine.max_num_seqs,
        ep=int(settings.get("ep") or 1),
        kv_cache_dtype=engine.kv_cache_dtype,
    ), engine


def _sim_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The report's step columns under the names the simulator records."""
    return pd.DataFrame(
        {
            "duration_s": steps["step_time"].fillna(0),
            "num_scheduled_tokens": steps["scheduled"].fillna(0),
            "num_prefill_tokens": steps["prefill"].fillna(0),
            "num_decode_tokens": steps["decode"].fillna(0),
            "decode_context_sum": steps["decode_context"],
            "prefill_context_sum": steps["prefill_context"],
        }
    )


def analyse(run: RunData, settings: dict[str, Any]) -> RunHardware:
    """``run`` read against its GPU, or the device a real engine ran on (``ValueError``
    when it cannot be)."""
    if settings.get("backend") == "engine":
        return _analyse_engine(run)
    from slotune.engine.sim.capacity import determine_capacity
    from slotune.engine.sim.roofline import ceilings, run_op_seconds, steps_roofline

    cm, engine = cost_model(settings, run.config)
    steps = _stored_steps(run)
    sim = _sim_steps(steps)
    datasheet, fitted = ceilings(cm)
    capacity: float | None
    try:
        blocks = (
            engine.num_gpu_blocks
            or determine_capacity(cm.profile, cm.model, cm.tp, engine).num_gpu_blocks
        )
        capacity = blocks * cm.block_bytes / _GIB
    except ValueError:
        capacity = None
    return RunHardware(
        run.label,
        _frame(steps, steps_roofline(cm.shard, datasheet, sim)),
        run_op_seconds(cm, sim),
        (datasheet.hbm_bytes_per_s, datasheet.flops_per_s),
        (fitted.hbm_bytes_per_s, fitted.flops_per_s),
        capacity,
        prefix_cache_hit_rate(run),
        bool(steps["decode_context"].notna().any()),
        ceilings=f"from the datasheet of the {cm.profile.gpu.description}",
    )


def _analyse_engine(run: RunData) -> RunHardware:
    """A run of slotune's real engine, read with its checkpoint's shapes in the dtype it
    ran in against the ceilings it recorded."""
    from dataclasses import replace

    from slotune.engine.config import EngineConfig
    from slotune.engine.sim.cost_model import Shard
    from slotune.engine.sim.models import model_from_hf_dict
    from slotune.engine.sim.roofline import Ceilings, run_floor_seconds, steps_roofline

    hw = run.summary.get("hardware")
    if not isinstance(hw, dict) or "ceilings" not in hw or "model_config" not in hw:
        raise ValueError(
            "the run recorded no device ceilings or model shapes (a slotune before the "
            "real engine's hardware view): run it again to read it"
        )
    engine = EngineConfig.from_dict(run.config) if run.config else EngineConfig()
    model = model_from_hf_dict(hw["model_config"], "checkpoint", "the run's config.json")
    model = replace(model, dtype_bytes=int(hw["dtype_bytes"]))
    shard = Shard.of(model, block_size=engine.block_size, kv_cache_dtype=engine.kv_cache_dtype)
    c = hw["ceilings"]
    peak = Ceilings(float(c["hbm_bytes_per_s"]), float(c["flops_per_s"]))
    steps = _stored_steps(run)
    sim = _sim_steps(steps)
    capacity = float(hw.get("kv_capacity_bytes") or 0) / _GIB
    return RunHardware(
        run.label,
        _frame(steps, steps_roofline(shard, peak, sim)),
        run_floor_seconds(shard, peak, sim),
        (peak.hbm_bytes_per_s, peak.flops_per_s),
        None,
        capacity or None,
        prefix_cache_hit_rate(run),
        bool(steps["decode_context"].notna().any()),
        ceilings=str(c.get("source") or "recorded with the run"),
        measured=True,
    )


def _stored_steps(run: RunData) -> pd.DataFrame:
    steps = run.steps.dropna(subset=["step_time", "scheduled"])
    if steps.empty:
        raise ValueError(f"{run.label}: no steps were stored")
    return steps


def _frame(steps: pd.DataFrame, roofline: pd.DataFrame) -> pd.DataFrame:
    return pd.concat(
        [
            steps[["time", "step_time", "kv_usage", "preempted"]].reset_index(drop=True),
            roofline.reset_index(drop=True),
        ],
        axis=1,
    )


# -- figures ------------------------------------------------------------------------------


def _sample(frame: pd.DataFrame, n: int) -> pd.DataFrame:
    if len(frame) <= n:
        return frame
    return frame.iloc[np.linspace(0, len(frame) - 1, n).round().astype(int)]


def roofline_figure(hws: list[RunHardware]) -> go.Figure | None:
    """Each run's steps: arithmetic intensity against achieved FLOP/s (log-log), colored
    by the prefill share of the step's tokens, under the peak roof (datasheet or measured)
    and, for a simulated run, the fitted one. FLOP/s in tera, or giga where every peak is
    under a TFLOP/s (a CPU)."""
    points = [h.steps[(h.steps["flops"] > 0) & (h.steps["achieved_flops"] > 0)] for h in hws]
    if all(p.empty for p in points):
        return None
    fig = make_subplots(
        rows=1,
        cols=len(hws),
        shared_yaxes=True,
        horizontal_spacing=0.05,
        subplot_titles=[h.label for h in hws],
    )
    lo = min(float(p["intensity"].min()) for p in points if not p.empty)
    hi = max(float(p["intensity"].max()) for p in points if not p.empty)
    xs = np.geomspace(max(lo / 2, 1e-2), max(hi * 2, hws[0].ridge * 4), 60)
    unit, scale = ("TFLOP/s", 1e12) if max(h.peak[1] for h in hws) >= 1e12 else ("GFLOP/s", 1e9)
    for j, (h, p) in enumerate(zip(hws, points, strict=True)):
        roofs = [(h.peak, h.peak_name, "solid")]
        if h.fitted is not None:
            roofs.append((h.fitted, "fitted", "dash"))
        for (bw, peak), name, dash in roofs:
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=np.minimum(peak, bw * xs) / scale,
                    mode="lines",
                    name=f"{name} roof",
                    line={"color": BUDGET if name != "fitted" else SLO_LINE, "dash": dash},
                    legendgroup=name,
                    showlegend=j == 0,
                    hoverinfo="skip",
                ),
                row=1,
                col=j + 1,
            )
        shown = _sample(p, MAX_ROOFLINE_POINTS)
        fig.add_trace(
            go.Scatter(
                x=shown["intensity"],
                y=shown["achieved_flops"] / scale,
                mode="markers",
                name="steps",
                marker={
                    "size": 5,
                    "color": shown["prefill_share"],
                    "colorscale": "Viridis",
                    "cmin": 0,
                    "cmax": 1,
                    "showscale": j == 0,
                    "colorbar": {"title": {"text": "prefill share"}, "tickformat": ".0%"},
                },
                showlegend=j == 0,
                hovertemplate=f"%{{x:.1f}} FLOP/B, %{{y:.3g}} {unit}<extra></extra>",
            ),
            row=1,
            col=j + 1,
        )
        fig.update_xaxes(
            type="log", title_text="arithmetic intensity (FLOP/byte)", row=1, col=j + 1
        )
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text=f"achieved {unit}", row=1, col=1)
    return finish(fig, "Roofline of every step", height=420)


def utilization_figure(hws: list[RunHardware]) -> go.Figure | None:
    """MBU and MFU (against each run's peak) over time, binned means, one color per run."""
    if all(h.steps["mbu"].max() <= 0 and h.steps["mfu"].max() <= 0 for h in hws):
        return None
    fig = go.Figure()
    for i, h in enumerate(hws):
        binned = bin_steps(h.steps, ["mbu", "mfu"])
        for col, dash in (("mbu", "solid"), ("mfu", "dot")):
            fig.add_trace(
                go.Scatter(
                    x=binned["time"],
                    y=binned[col],
                    mode="lines",
                    name=f"{h.label} {col.upper()}",
                    line={"color": run_color(i), "dash": dash},
                    hovertemplate=f"{h.label} {col.upper()}: %{{y:.0%}} at %{{x:.1f}} s"
                    "<extra></extra>",
                )
            )
    fig.update_xaxes(title_text="time (s)")
    names = " or ".join(sorted({h.peak_name for h in hws}))
    fig.update_yaxes(title_text=f"share of the {names} peak", tickformat=".0%", rangemode="tozero")
    return finish(fig, "Bandwidth (MBU) and compute (MFU) use over time")


def kv_memory_figure(hws: list[RunHardware]) -> go.Figure | None:
    """KV cache in use (GiB per GPU) over time against each run's capacity, preemptions
    marked."""
    if all(h.steps["kv_usage"].fillna(0).max() <= 0 for h in hws):
        return None
    fig = go.Figure()
    for i, h in enumerate(hws):
        scale = h.kv_capacity_gib or 1.0
        steps = h.steps.assign(kv=h.steps["kv_usage"] * scale)
        binned = bin_steps(steps, ["kv"])
        unit = "GiB" if h.kv_capacity_gib else "share"
        fig.add_trace(
            go.Scatter(
                x=binned["time"],
                y=binned["kv"],
                mode="lines",
                name=f"{h.label} KV in use",
                line={"color": run_color(i)},
                hovertemplate=f"{h.label}: %{{y:.2f}} {unit} at %{{x:.1f}} s<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[0.0, float(steps["time"].max())],
                y=[scale, scale],
                mode="lines",
                name=f"{h.label} capacity",
                line={"color": run_color(i), "dash": "dash", "width": 1},
                hoverinfo="skip",
            )
        )
        hit = steps[steps["preempted"].fillna(0) > 0]
        if not hit.empty:
            fig.add_trace(
                go.Scatter(
                    x=hit["time"],
                    y=hit["kv"],
                    mode="markers",
                    name=f"{h.label} preemption",
                    marker={"color": run_color(i), "symbol": "x", "size": 8},
                    hovertemplate=f"{h.label}: preempted at %{{x:.1f}} s<extra></extra>",
                )
            )
    unit = "GiB per GPU" if all(h.kv_capacity_gib for h in hws) else "share of capacity"
    fig.update_xaxes(title_text="time (s)")
    fig.update_yaxes(title_text=f"KV cache ({unit})", rangemode="tozero")
    return finish(fig, "KV-cache memory against capacity")


# -- sentences ----------------------------------------------------------------------------


def _num(x: float) -> str:
    """Whole from 10 up, two significant digits below (a CPU's ridge is about 1 FLOP/B)."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def _size(gib: float) -> str:
    return f"{gib:.1f} GiB" if gib >= 1 else f"{gib * 1024:.1f} MiB"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.01 else f"{100 * x:.1f}%"


def _median(h: RunHardware, col: str, where: pd.Series | None = None) -> float:
    s = h.steps[col] if where is None else h.steps.loc[where, col]
    s = s[s > 0]
    return float(s.median()) if not s.empty else 0.0


def roofline_sentence(hws: list[RunHardware]) -> str:
    parts = []
    for h in hws:
        mixed = h.steps["prefill_share"] > 0
        share = float(mixed.mean())
        ai = _median(h, "intensity")
        ai_mixed = _median(h, "intensity", mixed)
        text = (
            f"{h.label}: median step at {_num(ai)} FLOP/B ({ai / h.ridge:.2f} of the "
            f"{_num(h.ridge)} FLOP/B ridge)"
        )
        if share > 0:
            text += f", steps with prefill ({_pct(share)} of steps) at {ai_mixed / h.ridge:.2f}"
            longest = float(h.steps.loc[mixed, "step_time"].max())
            text += f", the longest of them {1e3 * longest:.0f} ms (a stall for every decode)"
        parts.append(text)
    tail = (
        " — below the ridge a step waits on memory (weights and KV reads), above it on "
        "compute (a GPU's tensor cores); more tokens per step raise the intensity."
    )
    return "; ".join(parts) + tail


def utilization_sentence(hws: list[RunHardware]) -> str:
    parts = [
        f"{h.label}: MBU {_pct(h.mbu())}"
        + (f" (of the fitted ceiling {_pct(h.mbu(True))})" if h.fitted else "")
        + f", MFU {_pct(h.mfu())}"
        + (f" against the ceilings {h.ceilings}" if h.measured else "")
        + f", its time mostly in {op_label(h, h.bound_op)} ({_pct(h.share(h.bound_op))})"
        for h in hws
    ]
    text = "; ".join(parts) + "."
    if len(hws) == 2:
        a, b = hws
        changed = max(a.ops, key=lambda k: abs(a.ops[k] - b.ops[k]))
        diff = a.ops[changed] - b.ops[changed]
        if abs(diff) <= 0.01 * max(sum(b.ops.values()), 1e-9):
            text += " The two spend their time alike, op by op (within 1% of the run)."
        else:
            text += (
                f" The largest change is in {OP_LABELS[changed]}: "
                f"{abs(diff):.2f} s {'more' if diff > 0 else 'less'} over the run for the "
                f"{a.label} configuration."
            )
    return text


def kv_sentence(hws: list[RunHardware]) -> str:
    parts = []
    for h in hws:
        peak = float(h.steps["kv_usage"].max())
        what = (
            f"peaks at {_size(peak * h.kv_capacity_gib)} of {_size(h.kv_capacity_gib)}"
            if h.kv_capacity_gib
            else f"peaks at {_pct(peak)} of its capacity"
        )
        pre = h.preemptions
        parts.append(
            f"{h.label}: the KV cache {what} with "
            + (f"{pre} preemption{'s' if pre != 1 else ''}" if pre else "no preemptions")
        )
    text = "; ".join(parts) + "."
    if any(h.preemptions for h in hws):
        text += (
            " Preemptions come when running requests outgrow the free blocks: a smaller "
            "max_num_seqs or budget, fp8 KV or more GPUs make room."
        )
    return text


def cache_sentence(hws: list[RunHardware]) -> str:
    rates = [(h.label, h.prefix_hit_rate) for h in hws]
    if all(r is None or r <= 0 for _, r in rates):
        return "No prompt tokens were served from the prefix cache in these runs."
    return (
        "Prefix-cache hit rate: "
        + ", ".join(f"{label} {_pct(r) if r is not None else 'n/a'}" for label, r in rates)
        + " of prompt tokens, prefill work (FLOPs and KV writes) that never ran."
    )


def op_label(h: RunHardware, op: str) -> str:
    return MEASURED_HOST if h.measured and op == "host" else OP_LABELS[op]


def _ceiling_names(hws: list[RunHardware]) -> list[str]:
    names = sorted({h.peak_name for h in hws})
    return [*names, "fitted"] if any(h.fitted for h in hws) else names


def ops_table(hws: list[RunHardware]) -> str:
    """Seconds per op over each run, with its share, and the headline ratios."""
    headers = ["op", *(f"{h.label}: s (share)" for h in hws)]
    rows: list[list[str]] = []
    measured = any(h.measured for h in hws)
    for op, label in OP_LABELS.items():
        if measured and op == "host":
            label = MEASURED_HOST
        rows.append([label, *(f"{h.ops[op]:.2f} ({_pct(h.share(op))})" for h in hws)])
    rows.append(["bound op", *(op_label(h, h.bound_op) for h in hws)])
    for name, use in (("MBU", RunHardware.mbu), ("MFU", RunHardware.mfu)):
        rows.append(
            [
                f"{name} ({' / '.join(_ceiling_names(hws))})",
                *(
                    f"{_pct(use(h))} / {_pct(use(h, True))}" if h.fitted else _pct(use(h))
                    for h in hws
                ),
            ]
        )
    rows.append(
        [
            "prefix-cache hit rate",
            *(_pct(h.prefix_hit_rate) if h.prefix_hit_rate is not None else "n/a" for h in hws),
        ]
    )
    return table(headers, rows, css="hardware")


def hardware_html(runs: list[RunData], settings: dict[str, Any]) -> str:
    """The report's hardware section for ``runs`` (recommended first)."""
    if not runs:
        return note("No stored runs to read against the GPU.")
    hws: list[RunHardware] = []
    problems: list[str] = []
    for run in runs:
        try:
            hws.append(analyse(run, settings))
        except (ValueError, KeyError) as exc:
            problems.append(f"{run.label}: {exc}")
    if not hws:
        return note("Not read against the GPU: " + "; ".join(problems))
    parts = [ops_table(hws)]
    for h in hws:
        if h.measured:
            parts.append(
                note(
                    f"{h.label}: measured on slotune's engine; its steps are read against "
                    f"the ceilings {h.ceilings}. Each op's seconds are its roofline floor at those "
                    "ceilings; the rest of the measured step time is under "
                    f"{MEASURED_HOST!r}."
                )
            )
    if problems:
        parts.append(note("Not read: " + "; ".join(problems)))
    if not all(h.has_context for h in hws):
        parts.append(
            note(
                "These runs' steps.csv lacks the per-step context columns (an older "
                "slotune): KV reads and prefill attention count as zero bytes and FLOPs."
            )
        )
    for key, fig, sentence in (
        ("roofline", roofline_figure(hws), roofline_sentence),
        ("utilization", utilization_figure(hws), utilization_sentence),
        ("kv_memory", kv_memory_figure(hws), kv_sentence),
    ):
        text = sentence(hws)
        if fig is None:
            parts.append(f'<p class="note" data-empty="{e(key)}">{e(text)}</p>')
        else:
            parts.append(f'{figure_block(key, fig)}\n<p class="caption">{e(text)}</p>')
    parts.append(f'<p class="caption">{e(cache_sentence(hws))}</p>')
    return "\n".join(parts)
