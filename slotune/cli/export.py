"""``slotune export``: a tuned configuration as a vLLM or SGLang command, or a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from slotune.cli.app import app
from slotune.cli.common import fail


@app.command()
def export(
    best: Annotated[Path, typer.Argument(help="best.json written by `slotune tune`.")],
    format: Annotated[
        str,
        typer.Option("--format", "-f", help="vllm | sglang | yaml | json (slotune EngineConfig)."),
    ] = "vllm",
) -> None:
    """Print the recommended configuration as a ready command line or config file."""
    from slotune.tuner.export import FORMATS
    from slotune.tuner.export import export as render

    if format not in FORMATS:
        fail(f"--format: unknown format {format!r}; use one of {', '.join(FORMATS)}")
    try:
        data = json.loads(best.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise ValueError('no "config" mapping; expected the best.json of `slotune tune`')
        text = render(data, format)
    except OSError as e:
        fail(f"{best}: cannot read ({e.strerror})")
    except ValueError as e:
        fail(f"{best}: {e}")
    typer.echo(text)
