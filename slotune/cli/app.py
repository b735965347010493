"""The typer application. Each command lives in its own module and is registered here.

Command modules import heavy packages (torch, optuna, pandas) inside their functions, so
that ``slotune --help`` and simulated runs start fast.
"""

from __future__ import annotations

import importlib

import typer

from slotune._version import __version__

app = typer.Typer(
    name="slotune",
    help="Find the LLM serving configuration that best meets your latency SLOs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"slotune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Show the version."
    ),
) -> None:
    """slotune: tune batch budget, chunked prefill, block size and more against TTFT/TPOT SLOs."""


_COMMAND_MODULES = (
    "tune",
    "deploy",
    "worker",
    "bench",
    "validate",
    "regress",
    "serve",
    "report",
    "export",
    "traces",
    "catalog",
    "hardware",
    "model",
    "calibrate",
)


def _register() -> None:
    """Import every command module (each adds its commands to ``app``), in --help order."""
    for name in _COMMAND_MODULES:
        importlib.import_module(f"slotune.cli.{name}")


_register()


def main() -> None:
    from slotune._extras import MissingExtra

    try:
        app()
    except MissingExtra as e:  # a command of an extra that is not installed: no traceback
        from slotune.cli.common import print_error

        print_error(str(e))
        raise SystemExit(2) from None
