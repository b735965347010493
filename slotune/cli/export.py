"""``slotune export``: a tuned configuration as a vLLM or SGLang command, or a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from slotune.cli.app import app


@app.command()
def export(
    best: Annotated[Path, typer.Argument(help="best.json written by `slotune tune`.")],
    format: Annotated[str, typer.Option(
        "--format", "-f", help="vllm | sglang | yaml | json (slotune EngineConfig).")] = "vllm",
) -> None:
    """Print the recommended configuration as a ready command line or config file."""
    from slotune.tuner.export import FORMATS
    from slotune.tuner.export import export as render

    err = Console(stderr=True)
    if format not in FORMATS:
        err.print(f"[red]error:[/red] --format: unknown format {format!r}; use one of "
                  f"{', '.join(FORMATS)}", highlight=False)
        raise typer.Exit(2)
    try:
        data = json.loads(best.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise ValueError("no \"config\" mapping; expected the best.json of `slotune tune`")
        text = render(data, format)
    except OSError as e:
        err.print(f"[red]error:[/red] {best}: cannot read ({e.strerror})", highlight=False)
        raise typer.Exit(2) from None
    except ValueError as e:
        err.print(f"[red]error:[/red] {best}: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    typer.echo(text)
