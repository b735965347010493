"""``slotune validate``: replay measured serving runs and show how far the simulator is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from slotune.cli.app import app
from slotune.cli.common import fail


@app.command("validate")
def validate_command(
    runs: Annotated[list[Path], typer.Argument(help="Measured run folders.")],
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU name or profile JSON (default: the run's).")
    ] = None,
    stack: Annotated[
        str | None, typer.Option("--stack", help="Serving stack name or JSON (default vllm-v1).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Catalogue model or config.json (default: the run's)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """Replay measured runs through the simulator with their own settings and arrivals and
    print predicted against measured TTFT, ITL and E2E (mean, p50, p90, p99), throughput
    and the error, per run and overall.

    A run is a folder in the layout of the BLIS sim-to-real study (requests.json,
    measured.json, profile.json) or the output folder of `slotune bench`.
    """
    from rich.console import Console
    from rich.table import Table

    from slotune.engine.sim.hardware import UnknownNameError
    from slotune.validate import load_run, overall, replay, run_row
    from slotune.validate.runs import RunFormatError

    rows = []
    for path in runs:
        try:
            run = load_run(path, gpu=gpu, model=model)
            rows.append(run_row(replay(run, gpu=gpu, stack=stack)))
        except (RunFormatError, UnknownNameError, ValueError) as e:
            fail(str(e))
    total = overall(rows)
    if as_json:
        typer.echo(json.dumps({"runs": rows, "overall": total}, indent=2))
        return
    console = Console()
    table = Table(title=f"simulator vs measured (stack {rows[0]['stack']})")
    table.add_column("run")
    for m in ("TTFT ms", "ITL ms", "E2E s"):
        table.add_column(f"{m} meas/pred", justify="right")
        table.add_column("err", justify="right")
    table.add_column("tput err", justify="right")
    for r in rows:
        cells = [r["run"] + (" [red](saturates)[/]" if r["saturated"] else "")]
        for m, scale, fmt in (("ttft", 1e3, ".1f"), ("itl", 1e3, ".2f"), ("e2e", 1.0, ".3f")):
            meas, pred = r[f"{m}_mean_meas"] * scale, r[f"{m}_mean_pred"] * scale
            cells += [f"{meas:{fmt}} / {pred:{fmt}}", f"{r[f'{m}_mean_err'] * 100:+.1f}%"]
        cells.append(f"{r['throughput_err'] * 100:+.1f}%")
        table.add_row(*cells)
    console.print(table)
    for m in ("ttft", "itl", "e2e"):
        console.print(
            f"{m.upper()}: mean absolute error {total[f'{m}_mean_mae_pct']:.1f}% of the mean, "
            f"p50 {total[f'{m}_p50_mae_pct']:.1f}%, p90 {total[f'{m}_p90_mae_pct']:.1f}%, "
            f"p99 {total[f'{m}_p99_mae_pct']:.1f}%"
        )
    if total["saturated_runs"]:
        console.print(f"[red]{int(total['saturated_runs'])} run(s) saturate in the simulator[/]")
