"""Where results are written: checked before any work starts, so that a bad ``--out`` (a
file where a folder is due, read-only media, a full disk, the command's own input) costs
one line and exit code 2 instead of a finished run's results. A write that still fails
later (the disk filled up meanwhile) is recognized by ``write_failure`` and reported in one
line; it is never mistaken for a database outage worth retrying.

One place for these rules: ``tune``, ``bench``, ``regress``, ``traces convert`` and
``report`` all call it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

MIN_FREE_BYTES = 8 * 2**20
"""Free space an output folder must have before a command starts: a tune folder holds a
~5 MB report.html next to its study, runs and CSVs (a bench folder is smaller)."""

_WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}
)
_SQLITE_WRITE_FAILURES = (
    "database or disk is full",
    "disk i/o error",
    "attempt to write a readonly database",
    "unable to open database file",
    "read-only file system",
    "no space left on device",
)


class OutputError(ValueError):
    """An output path that cannot be written; the message names the path and why."""


def check_folder(path: Path | str, *, need: int | None = None) -> None:
    """That ``path`` is, or can be created as, a writable folder with ``need`` bytes free.

    Nothing is left behind: the folder itself is not created."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path} exists and is not a folder")
    base = _existing_ancestor(path)
    if not base.is_dir():
        raise OutputError(f"{path}: {base} is a file, not a folder")
    _probe(base, path)
    need = MIN_FREE_BYTES if need is None else need
    free = _free_bytes(base)
    if free is not None and free < need:
        raise OutputError(
            f"{path}: only {_size(free)} free on its disk; at least {_size(need)} are needed"
        )


def check_file(
    path: Path | str,
    *,
    inputs: Iterable[Path | str] = (),
    overwrite: bool = True,
    need: int | None = None,
) -> None:
    """That the file ``path`` can be written: not one of ``inputs``, not an existing file
    unless ``overwrite``, not a folder, and in a writable folder (see ``check_folder``)."""
    path = Path(path)
    for source in inputs:
        if _same_file(path, Path(source)):
            raise OutputError(f"{path} is the input file; write the output elsewhere")
    if path.is_dir():
        raise OutputError(f"{path} is a folder, not a file")
    if path.exists() and not overwrite:
        raise OutputError(f"{path} already exists; add --force to overwrite it")
    if path.parent.exists() and not path.parent.is_dir():
        raise OutputError(f"{path}: {path.parent} is a file, not a folder")
    check_folder(path.parent, need=need)
    if path.exists():
        try:
            with path.open("ab"):  # opening to append changes nothing, and fails read-only
                pass
        except OSError as e:
            raise OutputError(f"cannot write {path} ({e.strerror or e})") from None


def write_failure(e: BaseException) -> str | None:
    """Why ``e`` (or an error that caused it) is a failed write to local storage (a full
    disk, read-only media, no permission), or None when it is something else."""
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _WRITE_ERRNOS:
            where = f": {current.filename}" if current.filename else ""
            return f"{current.strerror or os.strerror(current.errno)}{where}"
        text = str(getattr(current, "orig", None) or current).lower()
        for phrase in _SQLITE_WRITE_FAILURES:
            if phrase in text:
                return phrase[0].upper() + phrase[1:]
        current = current.__cause__ or current.__context__
    return None


def _existing_ancestor(path: Path) -> Path:
    current = path.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _probe(folder: Path, path: Path) -> None:
    """Create, write and delete a small file in ``folder``: what access bits cannot tell
    (read-only mounts, root on read-only media, a full disk)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".slotune-probe-", dir=folder)
    except OSError as e:
        raise OutputError(f"{path}: cannot write in {folder} ({e.strerror or e})") from None
    try:
        os.write(fd, b"\0" * 4096)
        os.fsync(fd)
    except OSError as e:
        raise OutputError(f"{path}: cannot write in {folder} ({e.strerror or e})") from None
    finally:
        os.close(fd)
        os.unlink(name)


def _free_bytes(folder: Path) -> int | None:
    try:
        stat = os.statvfs(folder)
    except (OSError, AttributeError):  # no statvfs (Windows): the probe has to do
        return None
    return stat.f_bavail * stat.f_frsize


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _size(n: int) -> str:
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.0f} KiB"
