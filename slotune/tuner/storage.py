"""Where a study lives: opening a storage URL, locking a study across workers, and riding
out a database that goes away for a while.

URLs: ``sqlite:///path.db`` (one machine), ``postgresql://user:pw@host/db`` (any number of
machines), ``journal:PATH`` (Optuna's journal file, for machines that share a filesystem
but no database). Opening is race-free: on PostgreSQL the first worker creates the tables
while the others wait on an advisory lock.

``study_lock(url, name)`` serializes what must happen once per study (creating it,
measuring the baseline) and what must be atomic across workers (counting the budget and
claiming a trial): a PostgreSQL advisory lock, released by the server when the holder's
connection dies, or a ``flock`` on ``<file>.slotune-lock`` for SQLite and journal files.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
JOURNAL_PREFIX = "journal:"
_SQLITE_TIMEOUT_S = 60
_CONNECT_TIMEOUT_S = 10
OPEN_PATIENCE_S = 60.0
_SCHEMA_LOCK = "slotune:schema"
DEFAULT_PATIENCE_S = 600.0


class StudyError(ValueError):
    """A study that cannot be created, joined or resumed as asked."""


class StorageUnreachable(StudyError):
    """The storage stayed unreachable longer than the worker's patience."""


@dataclass(frozen=True)
class Heartbeat:
    """Workers write a heartbeat every ``interval`` seconds while a trial runs; a running
    trial silent for ``grace`` seconds is failed and queued again (RDB storages only)."""

    interval: int = 30
    grace: int = 90

    @classmethod
    def every(cls, seconds: int) -> Heartbeat:
        return cls(seconds, 3 * seconds)


def quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
    warnings.filterwarnings("ignore", message=".*SQLite.*")
    # the workers run Optuna's heartbeat themselves, around ask and tell (see worker.py)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


def default_storage(out_dir: Path) -> str:
    return f"sqlite:///{out_dir / 'study.db'}"


def is_journal(url: str) -> bool:
    return url.startswith(JOURNAL_PREFIX)


def _file_of(url: str) -> Path | None:
    """The file of a SQLite or journal URL (None for a server or an in-memory database)."""
    if is_journal(url):
        return Path(url[len(JOURNAL_PREFIX) :]).expanduser()
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        return Path(path) if path and path != ":memory:" else None
    return None


def _is_postgres(url: str) -> bool:
    return url.startswith(("postgresql", "postgres://"))


@functools.lru_cache(maxsize=8)
def open_storage(url: str, heartbeat: Heartbeat | None = None) -> Any:
    """The Optuna storage of ``url``, opened once per process (and per heartbeat setting).

    A database that does not answer yet is waited for (with backoff, see ``retrying``);
    a bad URL or missing driver is a ``StudyError`` at once."""
    quiet_optuna()
    return retrying(
        lambda: _open(url, heartbeat), f"opening {redact(url)}", patience=OPEN_PATIENCE_S
    )


def _open(url: str, heartbeat: Heartbeat | None) -> Any:
    import optuna

    path = _file_of(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    if is_journal(url):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend(str(path)))
    try:
        with _schema_lock(url):
            storage = optuna.storages.RDBStorage(
                with_driver(url), engine_kwargs=_engine_kwargs(url), **_heartbeat_kwargs(heartbeat)
            )
    except Exception as e:  # SQLAlchemy raises many kinds for a bad URL or an unreachable DB
        if is_outage(e) or isinstance(e, StudyError):
            raise
        raise StudyError(
            f"--storage {redact(url)}: cannot open the storage ({first_line(e)})"
        ) from None
    if url.startswith("sqlite"):
        _fast_sqlite(storage.engine)
    return storage


def open_reader(url: str) -> Any:
    """The storage of ``url`` for reading an existing study: no tables are created, and
    no waiting on an unreachable database (reports and status answer at once)."""
    import optuna

    path = _file_of(url)
    if path is not None and not path.is_file():
        raise StudyError(f"{url}: no such file")
    if is_journal(url):
        return _open(url, None)
    return optuna.storages.RDBStorage(
        with_driver(url), engine_kwargs=_engine_kwargs(url), skip_table_creation=True
    )


def check_writable(url: str) -> None:
    """That the file of a SQLite or journal URL can be written (see ``slotune.outputs``);
    ``OutputError`` otherwise. Servers are checked when opened."""
    from slotune.outputs import check_file

    path = _file_of(url)
    if path is not None:
        check_file(path)


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": _SQLITE_TIMEOUT_S}}
    if _is_postgres(url):
        return {"pool_pre_ping": True, "connect_args": {"connect_timeout": _CONNECT_TIMEOUT_S}}
    return {"pool_pre_ping": True}


def _heartbeat_kwargs(heartbeat: Heartbeat | None) -> dict[str, Any]:
    import optuna

    if heartbeat is None:
        return {}
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is None:  # Optuna < 4.9
        callback = {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback()}
    else:
        callback = {"heartbeat_stale_trial_callback": retry()}
    return {"heartbeat_interval": heartbeat.interval, "grace_period": heartbeat.grace, **callback}


@contextlib.contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    """Serialize creating the tables of a fresh PostgreSQL database: two workers creating
    them at once collide on PostgreSQL's catalog (``pg_type_typname``)."""
    if not _is_postgres(url):
        yield
        return
    with _advisory_lock(url, _SCHEMA_LOCK):
        yield


def _fast_sqlite(engine: Any) -> None:
    """Write-ahead log with normal sync: each trial's dozen small commits no longer wait
    for the disk (SQLite's default made a 50-trial study spend ~20 s in fsync), and
    readers do not block the writing workers. A finished trial survives a crash or Ctrl-C
    of the process; only a power loss can drop the last commits."""
    import sqlalchemy

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(engine, "connect", on_connect)
    engine.dispose()


# PostgreSQL drivers SQLAlchemy knows, in the order slotune prefers them: psycopg 3 (what
# ``slotune[postgres]`` installs, and SQLAlchemy 2.1's default), then psycopg2.
_PG_DRIVERS = (("psycopg", "psycopg"), ("psycopg2", "psycopg2"))


def with_driver(url: str) -> str:
    """A ``postgresql://`` (or ``postgres://``) URL with the driver that is installed named
    in it: SQLAlchemy 2.1 maps a bare ``postgresql://`` to psycopg 3 and 2.0 to psycopg2,
    so the bare URL works only when the one that version expects happens to be there. A
    URL that names its driver (``postgresql+psycopg2://``) is left as it is."""
    import importlib.util

    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            for module, dialect in _PG_DRIVERS:
                if importlib.util.find_spec(module) is not None:
                    return f"postgresql+{dialect}://" + url[len(prefix) :]
            raise StudyError(
                f"--storage {redact(url)}: PostgreSQL needs the psycopg driver, which is not "
                "installed here: pip install 'slotune[postgres]'"
            )
    return url


@contextlib.contextmanager
def study_lock(url: str, name: str) -> Iterator[None]:
    """Hold the study's lock (see the module docstring); a no-op for other databases."""
    path = _file_of(url)
    if _is_postgres(url):
        with _advisory_lock(url, f"slotune:study:{name}"):
            yield
    elif path is not None:
        with _file_lock(path.with_name(path.name + ".slotune-lock")):
            yield
    else:
        yield


@contextlib.contextmanager
def _advisory_lock(url: str, key: str) -> Iterator[None]:
    """A session-level advisory lock on a connection of its own: the server releases it
    if this process dies while holding it."""
    import sqlalchemy

    number = int.from_bytes(
        hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True
    )
    engine = _lock_engine(url)
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": number})
        conn.commit()
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # a lost connection has lost the lock too
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": number})
                conn.commit()


@functools.lru_cache(maxsize=4)
def _lock_engine(url: str) -> Any:
    import sqlalchemy

    return sqlalchemy.create_engine(
        with_driver(url),
        pool_pre_ping=True,
        connect_args={"connect_timeout": _CONNECT_TIMEOUT_S},
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def watch_unwatched_trials(storage: Any, study_name: str) -> int:
    """Give every running trial of the study without a heartbeat its first one, so that it
    goes stale (and is retried) unless a worker keeps it alive. Such a trial was created
    by a worker that died or lost the database before its first heartbeat (claims record
    it under the study's lock, so none is in progress while the lock is held). Reads
    Optuna's ``trial_heartbeats`` table, which its public API does not expose."""
    import sqlalchemy

    query = sqlalchemy.text(
        "SELECT t.trial_id FROM trials t LEFT JOIN trial_heartbeats h "
        "ON h.trial_id = t.trial_id "
        "WHERE t.study_id = :study AND t.state = 'RUNNING' AND h.trial_id IS NULL"
    )
    study_id = storage.get_study_id_from_name(study_name)
    with storage.engine.connect() as conn:
        ids = [row[0] for row in conn.execute(query, {"study": study_id})]
    for trial_id in ids:
        storage.record_heartbeat(trial_id)
    return len(ids)


def is_outage(e: BaseException) -> bool:
    """Whether ``e`` (or what caused it) says the database could not be reached, as
    opposed to a query it refused: only the first is worth retrying."""
    import sqlalchemy.exc

    from slotune.outputs import write_failure

    if write_failure(e):  # a full disk or read-only media: waiting will not fix it
        return False
    kinds: tuple[type[BaseException], ...] = (
        sqlalchemy.exc.OperationalError,
        sqlalchemy.exc.InterfaceError,
        sqlalchemy.exc.DisconnectionError,
        # a session whose connection dropped mid-query, used again before its rollback
        sqlalchemy.exc.PendingRollbackError,
        ConnectionError,
    )
    for module in ("psycopg", "psycopg2"):
        driver = sys.modules.get(module)  # only a driver in use can have raised
        if driver is not None:
            kinds += (driver.OperationalError, driver.InterfaceError)
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if "no such table" in str(current):  # SQLite's OperationalError for a file with no study
            return False
        if isinstance(current, kinds):
            return True
        if isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated:
            return True
        current = current.__cause__ or current.__context__
    return False


def retrying(
    call: Callable[[], T],
    what: str,
    *,
    patience: float = DEFAULT_PATIENCE_S,
    say: Callable[[str], None] | None = None,
) -> T:
    """``call()``, retried with backoff (0.5 s doubling to 15 s) while the database is
    unreachable, saying so once per attempt; ``StorageUnreachable`` after ``patience``
    seconds. Any other error goes up at once."""
    say = say or _to_stderr
    start = time.monotonic()
    delay = 0.5
    while True:
        try:
            return call()
        except Exception as e:
            if not is_outage(e):
                raise
            waited = time.monotonic() - start
            if waited >= patience:
                raise StorageUnreachable(
                    f"the storage was unreachable for {waited:.0f} s while {what} "
                    f"({cause_text(e)}); giving up"
                ) from None
            say(f"storage unreachable while {what} ({cause_text(e)}); retrying in {delay:g} s")
            time.sleep(delay)
            delay = min(2 * delay, 15.0)


def cause_text(e: BaseException) -> str:
    """The first line of the innermost error: Optuna wraps a lost connection in a
    generic "exception during the commit"."""
    while e.__cause__ is not None:
        e = e.__cause__
    return first_line(getattr(e, "orig", None) or e)  # SQLAlchemy's driver error


def _to_stderr(message: str) -> None:
    sys.stderr.write(f"slotune: {message}\n")
    sys.stderr.flush()


def redact(url: str) -> str:
    """A storage URL without its password."""
    import re

    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
