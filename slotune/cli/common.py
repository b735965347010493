"""Pieces every command shares: how an option is declared and how bad input ends a command."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape


def opt(flag: str, help_text: str) -> Any:
    """A typer option that shows its default in --help."""
    return typer.Option(flag, help=help_text, show_default=True)


def fail(message: str) -> NoReturn:
    """Print one error line on stderr and exit with code 2 (bad input)."""
    print_error(message)
    raise typer.Exit(2)


def print_error(message: str) -> None:
    Console(stderr=True).print(
        f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True
    )


def writable_folder(path: Path | str, flag: str) -> None:
    """End the command (exit 2) unless ``path`` can be written as a results folder; call
    it before any work (see ``slotune.outputs``)."""
    from slotune.outputs import OutputError, check_folder

    try:
        check_folder(path)
    except OutputError as e:
        fail(f"{flag}: {e}")


def writable_file(
    path: Path | str, flag: str, *, inputs: Iterable[Path | str] = (), overwrite: bool = True
) -> None:
    """End the command (exit 2) unless the file ``path`` can be written (see
    ``slotune.outputs.check_file``)."""
    from slotune.outputs import OutputError, check_file

    try:
        check_file(path, inputs=inputs, overwrite=overwrite)
    except OutputError as e:
        fail(f"{flag}: {e}")
