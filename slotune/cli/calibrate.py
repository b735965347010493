"""`slotune calibrate`: fit the simulator's constants to measurements, three ways.

- ``--model DIR``: profile the real model on this machine, write a GPU profile;
- ``--from-runs RUN...``: fit a serving stack to measured serving runs;
- ``--from-kernels``: fit the shipped GPU profiles to the reference kernel times (or, with
  ``--report``, print the shipped profiles' errors against them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from slotune.cli.app import app
from slotune.cli.common import fail, writable_file, writable_folder


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
    from_kernels: Annotated[
        bool,
        typer.Option(
            "--from-kernels",
            help="Fit the shipped GPU profiles to reference kernel times (--reference).",
        ),
    ] = False,
    model: Annotated[
        str | None, typer.Option("--model", help="Local HF checkpoint folder.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="JSON to write (profile.json, or stack.json with --from-runs); with "
            "--from-kernels a folder for the profiles.",
        ),
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
    reference: Annotated[
        Path | None,
        typer.Option(
            "--reference",
            help="With --from-kernels: folder of *_mlp.csv / *_attention.csv kernel times "
            "(default: shared/reference/gpu-profiles beside the checkout).",
        ),
    ] = None,
    report: Annotated[
        bool,
        typer.Option(
            "--report",
            help="With --from-kernels: print the shipped profiles' errors, fit nothing.",
        ),
    ] = False,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    attention: Annotated[
        str, typer.Option("--attention", help="auto, torch, triton or flash.")
    ] = "auto",
    block_size: Annotated[int, typer.Option("--block-size", help="KV block size.")] = 16,
    threads: Annotated[
        int, typer.Option("--threads", help="CPU threads for torch (0: the executor's default).")
    ] = 0,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="Probe a deployment and fit its stack: the server's shell command with "
            "{port} in it (slotune starts and stops it), or the URL of one already running. "
            "Needs --gpu and --sim-model (and --tp, --config) for the replays.",
        ),
    ] = None,
    sim_model: Annotated[
        str | None, typer.Option("--sim-model", help="With --server: the served model's name.")
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="With --server: tensor-parallel GPUs.")] = 1,
    config: Annotated[
        str | None,
        typer.Option(
            "--config", help="With --server: the server's engine settings (EngineConfig JSON)."
        ),
    ] = None,
) -> None:
    """Profile the real model on this machine and fit a GPU profile for the simulator, or
    (`--from-runs RUN...`) fit a serving stack to measured serving runs, or
    (`--from-kernels`) refit the shipped GPU profiles to reference kernel times.

    The profile file works wherever a GPU name does (`--gpu profile.json`), the stack file
    wherever a stack does (`--stack stack.json`).
    """
    console = Console()
    if sum((from_runs, from_kernels, server is not None)) > 1:
        fail("choose one of --from-runs, --from-kernels and --server")
    if out is not None:  # before profiling or fitting anything (--from-kernels: a folder)
        (writable_folder if from_kernels else writable_file)(out, "--out")
    warmup, one_workload = 20.0, False
    if server is not None:
        runs = _probe(console, server, gpu, sim_model, tp, config, out or Path("stack.json"))
        # a probe's runs are short and scored whole, and they are one workload's
        from_runs, warmup, one_workload = True, 0.0, True
    if from_runs:
        _from_runs(
            console,
            runs or [],
            out or Path("stack.json"),
            gpu,
            stack,
            name,
            evaluations,
            window,
            warmup,
            one_workload,
        )
    elif from_kernels:
        _from_kernels(console, reference, out, report)
    else:
        if runs:
            fail("run folders need --from-runs")
        _on_device(
            console, model, out or Path("profile.json"), device, attention, block_size, threads
        )


def _on_device(
    console: Console,
    model: str | None,
    out: Path,
    device: str,
    attention: str,
    block_size: int,
    threads: int,
) -> None:
    if model is None:
        fail("give --model DIR (or --from-runs RUN..., or --from-kernels)")
    if device not in ("auto", "cpu", "cuda"):
        fail(f"--device {device!r} must be auto, cpu or cuda")
    if not (Path(model) / "config.json").is_file():
        fail(f"--model {model!r} is not a folder with a config.json")
    import json
    import statistics

    from slotune.calibration.on_device import calibrate, profile_json

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
        fail(str(e))
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


def _probe(
    console: Console,
    server: str,
    gpu: str | None,
    sim_model: str | None,
    tp: int,
    config: str | None,
    out: Path,
) -> list[Path]:
    """Run the fixed probe against the server; the run folders go beside ``out``."""
    from contextlib import nullcontext

    from slotune.calibration.probe import Deployment, probe
    from slotune.engine.knobs import EngineKnobs, engine_config
    from slotune.workloads.server_process import ServerProcess, ServerStartError, free_port

    if not gpu or not sim_model:
        fail("--server needs --gpu and --sim-model: the simulator replays the probe on them")
    try:
        probe_config = engine_config(config, EngineKnobs(), lambda: 8192)
    except ValueError as e:
        fail(f"--config: {e}")
    runs_dir = out.parent / f"{out.stem}-probe"
    if server.startswith(("http://", "https://")):
        url, process = server, None
    elif "{port}" not in server:
        fail(f"--server: the command needs {{port}} in it, or give a URL (got {server!r})")
    else:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = server.replace("{port}", str(port))
        process = ServerProcess(command, url, log=runs_dir / "server.log", start_timeout_s=600)
    try:
        with process if process is not None else nullcontext():
            return probe(
                url,
                Deployment(gpu, sim_model, tp, probe_config),
                runs_dir,
                log=lambda msg: console.print(f"[dim]{msg}[/]"),
            )
    except ServerStartError as e:
        fail(f"--server: {e}")
    except OSError as e:
        fail(f"--server: {url} did not answer ({e})")


def _from_runs(
    console: Console,
    runs: list[Path],
    out: Path,
    gpu: str | None,
    stack: str | None,
    name: str,
    evaluations: int,
    window: float,
    warmup: float = 20.0,
    one_workload: bool = False,
) -> None:
    from slotune.calibration.from_runs import (
        ONE_WORKLOAD_PARAMS,
        PARAMS,
        fit_from_runs,
        write_fit,
    )
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
            params=ONE_WORKLOAD_PARAMS if one_workload else PARAMS,
            window_s=window,
            warmup_s=warmup,
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
    if result.at_bounds:
        console.print(
            f"[yellow]on a bound (a finding, not a result): {', '.join(result.at_bounds)}[/]"
        )
    console.print(f"use it as [bold]--stack {out}[/]")


def _from_kernels(console: Console, reference: Path | None, out: Path | None, report: bool) -> None:
    from slotune.calibration.errors import profile_errors
    from slotune.calibration.readers import DEFAULT_REFERENCE, FIT_SOURCES
    from slotune.calibration.tables import errors_markdown
    from slotune.engine.sim.profile import load_profile

    reference = reference or DEFAULT_REFERENCE
    if not reference.is_dir():
        fail(f"reference folder {reference} not found; pass --reference")
    if report:
        for gpu in FIT_SOURCES:
            typer.echo(
                f"\n### {gpu}\n\n" + errors_markdown(profile_errors(load_profile(gpu), reference))
            )
        return
    if out is None:
        fail("--from-kernels writes a folder of profiles: give --out DIR (or --report)")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} exists and is not a folder")
    from slotune.calibration.kernel_fit import fit_all, write_profiles

    profiles = fit_all(reference)
    for path in write_profiles(profiles, reference, out):
        console.print(f"wrote {path}")
    for gpu in FIT_SOURCES:
        typer.echo(f"\n### {gpu}\n\n" + errors_markdown(profile_errors(profiles[gpu], reference)))
