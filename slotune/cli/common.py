"""Pieces every command shares: how an option is declared and how bad input ends a command."""

from __future__ import annotations

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
