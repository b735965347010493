"""The error every reader raises for bad input: file, line or row, what was expected."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slotune.workloads import limits


class TraceFormatError(ValueError):
    def __init__(self, path: str | Path, where: str, message: str) -> None:
        super().__init__(f"{path}:{where}: {message}")
        self.path = str(path)
        self.where = where


class DropCounter(Counter):
    """Rows dropped by filters, by reason, so that none is silently lost."""

    def drop(self, reason: str) -> None:
        self[reason] += 1


BOM = "\ufeff"


def read_text(path: Path) -> str:
    """The file as UTF-8 text (without a byte-order mark); bytes that are not UTF-8 are an
    error naming their line, and a file over ``MAX_WHOLE_FILE_BYTES`` is refused unread."""
    size = Path(path).stat().st_size
    if size > limits.MAX_WHOLE_FILE_BYTES:
        raise TraceFormatError(
            path,
            "size",
            f"{size / 2**20:.0f} MiB is more than the {limits.MAX_WHOLE_FILE_BYTES / 2**20:.0f} "
            "MiB this format is read up to (it is read whole); use a smaller trace",
        )
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceFormatError(
            path, f"line {line}", f"not UTF-8 text (byte 0x{data[exc.start]:02x}); expected UTF-8"
        ) from None


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line, ends kept, read as a stream: UTF-8 (without
    a byte-order mark), at most ``MAX_TRACE_ROWS`` lines."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno > limits.MAX_TRACE_ROWS:
                raise TraceFormatError(
                    path,
                    f"line {lineno}",
                    f"more than {limits.MAX_TRACE_ROWS} lines; slotune reads traces up to "
                    "that many requests (cut the file)",
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceFormatError(
                    path,
                    f"line {lineno}",
                    f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); expected UTF-8",
                ) from None
            yield lineno, text.removeprefix(BOM) if lineno == 1 else text


def read_head(path: Path, size: int = 1 << 16) -> str:
    """The first ``size`` bytes as text (undecodable bytes replaced, no byte-order mark),
    to detect a format."""
    with open(path, "rb") as f:
        return f.read(size).decode("utf-8", errors="replace").removeprefix(BOM)


def iter_json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` for each non-blank line of a JSON-lines file."""
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(
                path,
                f"line {lineno}",
                f"invalid JSON ({exc.msg}); expected one JSON object per line",
            ) from None
        except (ValueError, RecursionError) as exc:
            raise TraceFormatError(
                path, f"line {lineno}", f"invalid JSON ({str(exc)[:100]})"
            ) from None


@contextmanager
def at(path: Path, where: str) -> Iterator[None]:
    """Turn a ``ValueError`` from checking a value into a ``TraceFormatError`` at ``where``."""
    try:
        yield
    except TraceFormatError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        raise TraceFormatError(path, where, str(exc)) from None
