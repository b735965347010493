"""``slotune explain``: a tune folder's recommended and baseline runs read against the GPU,
op by op; and the roofline table ``slotune estimate`` prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from slotune.cli.app import app
from slotune.cli.common import fail


def roofline_table(r: Any, title: str) -> Table:
    """The per-op roofline of one step (a ``roofline.StepRoofline``)."""
    table = Table(title=title)
    for col in ("op", "ms", "share", "GFLOP", "GB", "FLOP/B", "bound by"):
        table.add_column(col, justify="left" if col in ("op", "bound by") else "right")
    for op, o in r.ops.items():
        intensity = f"{o.flops / o.hbm_bytes:.1f}" if o.hbm_bytes else "-"
        marker = " ◀" if op == r.bound_op else ""
        table.add_row(
            op + marker,
            f"{o.seconds * 1e3:.3f}",
            f"{o.seconds / r.seconds:.0%}" if r.seconds else "-",
            f"{o.flops / 1e9:.1f}",
            f"{(o.hbm_bytes or o.link_bytes) / 1e9:.3f}" + (" (link)" if op == "allreduce" else ""),
            intensity,
            r.limit(op),
        )
    table.caption = (
        f"step {r.seconds * 1e3:.3f} ms: {r.flops / 1e9:.1f} GFLOP, {r.hbm_bytes / 1e9:.2f} GB "
        f"of HBM, {r.intensity:.1f} FLOP/B (ridge {r.datasheet.ridge:.0f}); "
        f"MBU {r.mbu():.0%} ({r.mbu(r.fitted):.0%} of the fitted ceiling), "
        f"MFU {r.mfu():.0%} ({r.mfu(r.fitted):.0%}); bound op: {r.bound_op} "
        f"({r.limit(r.bound_op)})"
    )
    return table


@app.command()
def explain(
    best_json: Annotated[
        Path, typer.Argument(help="best.json of a `slotune tune` folder (or the folder).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Explain the recommendation in hardware terms: each stored run's time by op, MBU,
    MFU and bound op, recommended against the vLLM defaults (runs nothing)."""
    from slotune.reports.best import section
    from slotune.reports.build import RECOMMENDED, baseline_label
    from slotune.reports.hardware import (
        OP_LABELS,
        analyse,
        kv_sentence,
        op_label,
        utilization_sentence,
    )
    from slotune.reports.runs import load_run, read_json

    path = best_json / "best.json" if best_json.is_dir() else best_json
    if not path.is_file():
        fail(f"{best_json}: no best.json; give the best.json of a `slotune tune` --out folder")
    best = read_json(path)
    if not best:
        fail(f"{path}: not a JSON object")
    runs_dir = path.parent / "runs"
    labelled = (
        ("best", RECOMMENDED, section(best, "config")),
        ("baseline", baseline_label(best), section(section(best, "baseline"), "config")),
    )
    hws = []
    for folder, label, config in labelled:
        run = load_run(runs_dir / folder, label, config or None)
        try:
            hws.append(analyse(run, best))
        except (ValueError, KeyError) as exc:
            fail(f"{runs_dir / folder}: cannot read it against the GPU ({exc})")
    if as_json:
        data = {
            h.label: {
                "op_seconds": h.ops,
                "bound_op": h.bound_op,
                "mbu": h.mbu(),
                "mfu": h.mfu(),
                "mbu_fitted": h.mbu(True),
                "mfu_fitted": h.mfu(True),
                "preemptions": h.preemptions,
                "kv_capacity_gib": h.kv_capacity_gib,
                "prefix_cache_hit_rate": h.prefix_hit_rate,
            }
            for h in hws
        }
        typer.echo(json.dumps(data, indent=2))
        return
    a, b = hws
    where = best.get("gpu") or "the engine's device"
    table = Table(title=f"{best.get('model')} on {where}: seconds per op over each run")
    table.add_column("op")
    for h in hws:
        table.add_column(h.label, justify="right")
    table.add_column("change", justify="right")
    for op in OP_LABELS:
        change = a.ops[op] - b.ops[op]
        table.add_row(
            op_label(a, op),
            f"{a.ops[op]:.2f} ({a.share(op):.0%})",
            f"{b.ops[op]:.2f} ({b.share(op):.0%})",
            f"{change:+.2f}",
        )
    table.add_row("bound op", op_label(a, a.bound_op), op_label(b, b.bound_op), "")
    for name, f in (("MBU", "mbu"), ("MFU", "mfu")):
        table.add_row(
            f"{name} ({a.peak_name} / fitted)" if a.fitted else f"{name} ({a.peak_name})",
            *(
                f"{getattr(h, f)():.0%} / {getattr(h, f)(True):.0%}"
                if h.fitted
                else f"{getattr(h, f)():.0%}"
                for h in hws
            ),
            f"{getattr(a, f)() - getattr(b, f)():+.1%}",
        )
    console = Console()
    console.print(table)
    console.print(utilization_sentence(hws), highlight=False)
    console.print(kv_sentence(hws), highlight=False)
