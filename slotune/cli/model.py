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
