"""``slotune export``: the measured configuration as the target engine's launch line, a
``vllm serve --config`` file, or slotune's EngineConfig JSON; refused, with the reason,
when the engine cannot run it exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from slotune.cli import engine_options as eo
from slotune.cli.app import app
from slotune.cli.common import fail


@app.command()
def export(
    best: Annotated[Path, typer.Argument(help="best.json written by `slotune tune`.")],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="command (the study's target) | vllm | sglang | slotune | yaml "
            "(`vllm serve --config` file) | json (slotune EngineConfig).",
        ),
    ] = "command",
    target: eo.TargetName = None,
    served_model: Annotated[
        str | None,
        typer.Option(
            "--served-model",
            help="Checkpoint the engine serves (path or Hugging Face id; default: the "
            "tuned model's); a pre-quantized one for quantized weights.",
        ),
    ] = None,
) -> None:
    """Print exactly the measured configuration for the target engine, or why it cannot."""
    from slotune.tuner.export import FORMATS
    from slotune.tuner.export import export as render

    if format not in FORMATS:
        fail(f"--format: unknown format {format!r}; use one of {', '.join(FORMATS)}")
    try:
        data = json.loads(best.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise ValueError('no "config" mapping; expected the best.json of `slotune tune`')
        text = render(data, format, target=target, served_model=served_model)
    except OSError as e:
        fail(f"{best}: cannot read ({e.strerror})")
    except ValueError as e:  # ExportRefused is one: the reason, on one line
        fail(f"{best}: {e}")
    typer.echo(text)
