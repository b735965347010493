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
    model: Annotated[str, typer.Option("--model", help="Local HF checkpoint folder.")],
    out: Annotated[Path, typer.Option("--out", help="Profile JSON to write.")] = Path(
        "profile.json"
    ),
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    attention: Annotated[
        str, typer.Option("--attention", help="auto, torch, triton or flash.")
    ] = "auto",
    block_size: Annotated[int, typer.Option("--block-size", help="KV block size.")] = 16,
    threads: Annotated[
        int, typer.Option("--threads", help="CPU threads for torch (0: the executor's default).")
    ] = 0,
) -> None:
    """Profile the real model on this machine and fit a GPU profile for the simulator.

    The profile file works wherever a GPU name does: `--gpu profile.json`.
    """
    console = Console()
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
