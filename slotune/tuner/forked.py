"""Independent simulated runs at once, on the machine's other cores.

The tuner's runs share nothing but the study's evaluator. Forked children inherit the
evaluator, its trace and the trace's prompt tokens as they are, instead of rebuilding them
as a spawned process would, and send back only what each run returns. Where the platform
does not fork safely (anything but Linux) or one core is all there is, the runs go one
after another in this process: the results are the same either way, as simulated runs
are deterministic.

One mechanism, ``Server``: a forked child that answers request after request.
``map_forked`` spreads items over a few of them (``ForkedMap``: the same, while this process
does other work). A child ends quietly on Ctrl-C (it reaches
the whole process group): the parent handles it.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import wait
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def forks() -> bool:
    """Whether work goes to forked processes here."""
    return sys.platform == "linux" and cores() > 1


class ChildError(RuntimeError):
    """A child's call raised something that does not pickle (its text is kept)."""


class Server:
    """A forked child that handles one request at a time for as long as it lives, where
    ``forks()``: forked once, so this process and the child copy the pages they share once,
    not at every request. ``handle(request)`` yields what the child has to say, and
    ``next`` waits for each in turn; ``kill`` ends it (the next ``send`` forks another)."""

    def __init__(self, handle: Callable[[Any], Iterator[Any]]) -> None:
        self.handle = handle
        self.line: Any = None  # this end of the pipe to the child (to ``wait`` on)
        self._child: Any = None
        self.busy = False

    def send(self, request: Any) -> bool:
        """Hand ``request`` to the child (forked now if none lives); False where this
        process does not fork. The child must have said all it had to say before."""
        if not forks():
            return False
        if self.busy:
            raise RuntimeError("Server.send: the last request is not answered yet")
        if self._child is None:
            context = multiprocessing.get_context("fork")
            self.line, theirs = context.Pipe(duplex=True)
            self._child = context.Process(
                target=_serve, args=(self.handle, theirs, os.getpid()), daemon=True
            )
            self._child.start()
            theirs.close()
        self.line.send(request)
        self.busy = True
        return True

    def next(self) -> tuple[bool, Any]:
        """``(True, item)``: the next item the request's handling yields; ``(False,
        error)``: it said all (error None), raised ``error``, or the child died
        (``ChildError``)."""
        if not self.busy:
            return False, None
        try:
            said, item = self.line.recv()
        except (EOFError, OSError):
            self.kill()
            return False, ChildError("the child ended without an answer")
        if not said:
            self.busy = False
        return said, item

    def kill(self) -> None:
        if self._child is not None:
            self._child.terminate()
            self._child.join()
            self.line.close()
        self._child = self.line = None
        self.busy = False


def _serve(handle: Callable[[Any], Iterator[Any]], line: Any, parent: int) -> None:
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    _die_with(parent)
    while True:
        try:
            request = line.recv()
        except EOFError:
            return
        error: BaseException | None = None
        try:
            for item in handle(request):
                line.send((True, item))
        except Exception as e:
            error = e
        try:
            line.send((False, error))
        except Exception:  # it does not pickle
            line.send((False, ChildError(f"{type(error).__name__}: {error}")))


def _die_with(parent: int) -> None:
    """End this child when its parent ends, even killed (Linux's PR_SET_PDEATHSIG): an
    orphan would measure for nothing and hold the parent's output pipes open."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it ended before that took hold
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def map_forked(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None) -> list[R]:
    """``[fn(item) for item in items]`` in forked processes, ``workers`` at once (default:
    one per item), each taking the next item as it finishes one (where ``forks()``; in this
    process otherwise). ``fn`` may be a closure: the children inherit it. What it returns
    must pickle. An exception in a child is raised here."""
    with ForkedMap(fn, items, workers) as pending:
        return pending.results()


class ForkedMap(Generic[R]):
    """``map_forked`` under way: the children start on the items at once, while this
    process does other work; ``results`` waits for them. Used as a context manager, which
    ends the children however the block ends. Where work does not fork, ``results``
    computes the items here, one after another."""

    def __init__(
        self, fn: Callable[[T], R], items: Sequence[T], workers: int | None = None
    ) -> None:
        self._fn: Callable[[Any], R] = fn
        self._items: Sequence[Any] = items
        workers = min(len(items), workers or len(items))
        self._servers: list[Server] = []
        self._serving: dict[Server, int] = {}
        self._todo = iter(range(len(items)))
        if workers < 2 or not forks():
            return

        def handle(index: int) -> Iterator[R]:
            yield fn(items[index])

        self._servers = [Server(handle) for _ in range(workers)]
        try:
            for server in self._servers:
                server.send(index := next(self._todo))
                self._serving[server] = index
        except BaseException:
            self.close()
            raise

    def results(self) -> list[R]:
        """Each item's result, in order; an exception in a child is raised here."""
        if not self._servers:
            return [self._fn(item) for item in self._items]
        results: list[Any] = [None] * len(self._items)
        serving = self._serving
        while serving:
            ready = wait([s.line for s in serving])
            for server in [s for s in serving if s.line in ready]:
                said, value = server.next()
                if not said:
                    raise value or ChildError("the child ended without an answer")
                said, error = server.next()  # the end of its answer
                if error is not None:
                    raise error
                results[serving.pop(server)] = value
                index = next(self._todo, -1)
                if index >= 0:
                    server.send(index)
                    serving[server] = index
        return results

    def close(self) -> None:
        """End the children (those still at work stop)."""
        for server in self._servers:
            server.kill()
        self._serving.clear()

    def __enter__(self) -> ForkedMap[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
