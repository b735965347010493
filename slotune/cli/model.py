"""`slotune init-model`: write a small random-weight checkpoint that runs fully offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from slotune.cli.app import app

_PRESETS = ("tiny", "small")


@app.command("init-model")
def init_model_command(
    out: Annotated[Path, typer.Argument(help="Folder to write the checkpoint into.")],
    preset: str = typer.Option("tiny", "--preset", help="Model size: tiny or small."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
) -> None:
    """Write a random-weight Llama checkpoint with a freshly trained BPE tokenizer."""
    console = Console()
    if preset not in _PRESETS:
        console.print(f"[red]error:[/] --preset {preset!r} is unknown; choose tiny or small")
        raise typer.Exit(2)
    if out.exists() and not out.is_dir():
        console.print(f"[red]error:[/] {out} exists and is not a folder")
        raise typer.Exit(2)
    from slotune.engine.model.init_model import PRESETS, init_model

    folder = init_model(out, preset=preset, seed=seed)
    p = PRESETS[preset]
    console.print(
        f"wrote [bold]{preset}[/] Llama checkpoint to [bold]{folder}[/]: "
        f"{p.num_hidden_layers} layers, hidden {p.hidden_size}, "
        f"{p.num_attention_heads} heads ({p.num_key_value_heads} KV), vocab {p.vocab_size}"
    )


@app.command("calibrate")
def calibrate_command(
    runs: Annotated[
        list[Path] | None, typer.Argument(help="With --from-runs: measured run folders.")
    ] = None,
    from_runs: Annotated[
        bool,
        typer.Option(
            "--from-runs", help="Fit a serving stack from measured runs instead of profiling."
        ),
    ] = False,
    model: Annotated[
        str | None, typer.Option("--model", help="Local HF checkpoint folder.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="JSON to write (profile.json, or stack.json with --from-runs)."),
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="With --from-runs: the runs' GPU profile.")
    ] = None,
    stack: Annotated[
        str | None, typer.Option("--stack", help="With --from-runs: the stack to start from.")
    ] = None,
    name: Annotated[str, typer.Option("--name", help="With --from-runs: the stack's name.")] = (
        "fitted"
    ),
    evaluations: Annotated[
        int, typer.Option("--evaluations", help="With --from-runs: replays the fit may use.")
    ] = 60,
    window: Annotated[
        float,
        typer.Option("--window", help="With --from-runs: seconds of each load stage replayed."),
    ] = 150.0,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    attention: Annotated[
        str, typer.Option("--attention", help="auto, torch, triton or flash.")
    ] = "auto",
    block_size: Annotated[int, typer.Option("--block-size", help="KV block size.")] = 16,
    threads: Annotated[
        int, typer.Option("--threads", help="CPU threads for torch (0: the executor's default).")
    ] = 0,
) -> None:
    """Profile the real model on this machine and fit a GPU profile for the simulator, or
    (`--from-runs RUN...`) fit a serving stack to measured serving runs.

    The profile file works wherever a GPU name does (`--gpu profile.json`), the stack file
    wherever a stack does (`--stack stack.json`).
    """
    console = Console()
    if from_runs:
        _calibrate_from_runs(
            console, runs or [], out or Path("stack.json"), gpu, stack, name, evaluations, window
        )
        return
    if runs:
        console.print("[red]error:[/] run folders need --from-runs")
        raise typer.Exit(2)
    if model is None:
        console.print("[red]error:[/] give --model DIR (or --from-runs RUN...)")
        raise typer.Exit(2)
    out = out or Path("profile.json")
    if device not in ("auto", "cpu", "cuda"):
        console.print(f"[red]error:[/] --device {device!r} must be auto, cpu or cuda")
        raise typer.Exit(2)
    if not (Path(model) / "config.json").is_file():
        console.print(f"[red]error:[/] --model {model!r} is not a folder with a config.json")
        raise typer.Exit(2)
    import json
    import statistics

    from slotune.engine.model.calibrate import calibrate, profile_json

    try:
        result = calibrate(
            model,
            device=device,
            attention=attention,
            block_size=block_size,
            progress=lambda msg: console.print(f"[dim]{msg}[/]"),
            threads=threads or None,
        )
    except ValueError as e:
        console.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    data = profile_json(result)
    out.write_text(json.dumps(data, indent=2) + "\n")
    grid = sorted(abs(c["predicted_ms"] / c["measured_ms"] - 1) * 100 for c in data["calibration"])
    steps = data.get("calibration_workload_steps", {})
    console.print(
        f"wrote [bold]{out}[/]: cost-model error on {len(grid)} grid shapes median "
        f"{statistics.median(grid):.1f}%, on {steps.get('count', 0)} recorded engine steps "
        f"median {steps.get('median_abs_error_pct', float('nan')):.1f}%; "
        f"use it as [bold]--gpu {out}[/]"
    )


def _calibrate_from_runs(
    console: Console,
    runs: list[Path],
    out: Path,
    gpu: str | None,
    stack: str | None,
    name: str,
    evaluations: int,
    window: float,
) -> None:
    from slotune.calibration.from_runs import fit_from_runs, write_fit
    from slotune.cli.common import fail
    from slotune.engine.sim.hardware import UnknownNameError
    from slotune.engine.sim.profile import load_profile
    from slotune.engine.sim.stack import load_stack
    from slotune.validate import load_run
    from slotune.validate.runs import RunFormatError

    if not runs:
        fail("--from-runs needs at least one measured run folder")
    if evaluations < 1 or window <= 0:
        fail("--evaluations must be >= 1 and --window > 0")
    try:
        measured = [load_run(r, gpu=gpu) for r in runs]
        result = fit_from_runs(
            measured,
            stack=load_stack(stack),
            profile=load_profile(gpu) if gpu else None,
            window_s=window,
            max_evaluations=evaluations,
            progress=lambda n, rms, _: console.print(
                f"[dim]replay {n}: rms log error {rms:.3f}[/]"
            ),
        )
    except (RunFormatError, UnknownNameError, ValueError) as e:
        fail(str(e))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_fit(result, out, name)
    values = ", ".join(f"{k} {v:.4g}" for k, v in result.values.items())
    console.print(f"wrote [bold]{out}[/] from {len(measured)} runs: {values}")
    console.print(f"use it as [bold]--stack {out}[/]")
