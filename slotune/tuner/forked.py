"""Independent simulated runs at once, on the machine's other cores.

The tune's finish reruns the recommendation under each policy the target lacks (the
what-if): runs that share nothing but the study's evaluator. Forked children inherit the
evaluator, its trace and the trace's prompt tokens as they are, instead of rebuilding them
as a spawned process would, and send back only what each run returns. Where the platform
does not fork safely (anything but Linux) or one core is all there is, the runs go one
after another in this process: the results are the same either way, as simulated runs
are deterministic.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_task: tuple[Callable[[Any], Any], Sequence[Any]] | None = None
"""The running map's function and items: set before the children fork, read in them."""


def cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def forks() -> bool:
    """Whether ``map_forked`` runs its items in forked processes here."""
    return sys.platform == "linux" and cores() > 1


def map_forked(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None) -> list[R]:
    """``[fn(item) for item in items]`` in forked processes, ``workers`` at once (default:
    one per item), each taking the next item as it finishes one (where ``forks()``; in this
    process otherwise). ``fn`` may be a closure: the children inherit it. What it returns
    must pickle. An exception in a child is raised here."""
    global _task
    workers = min(len(items), workers or len(items))
    if workers < 2 or not forks():
        return [fn(item) for item in items]
    if _task is not None:
        raise RuntimeError("map_forked: one map at a time")
    _task = (fn, items)
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            return list(pool.map(_call, range(len(items))))
    finally:
        _task = None


def _call(index: int) -> Any:
    if _task is None:
        raise RuntimeError("map_forked: a child started without its task")
    fn, items = _task
    return fn(items[index])


class Background:
    """One call at a time run in a forked child while this process goes on (where
    ``forks()``): ``start`` forks it under a key, ending the call running before; the call
    yields what it has to say, and ``next`` waits for each in turn."""

    def __init__(self) -> None:
        self.key: object = None
        self._child: Any = None
        self._answer: Any = None

    def start(self, key: object, fn: Callable[[], Iterator[Any]]) -> bool:
        """Run ``fn()`` in a new child under ``key``, each item it yields sent here as it
        comes; False (nothing started) where this process does not fork."""
        self.cancel()
        if not forks():
            return False
        context = multiprocessing.get_context("fork")
        answer, send = context.Pipe(duplex=False)
        child = context.Process(target=_answer, args=(fn, send), daemon=True)
        child.start()
        send.close()
        self.key, self._child, self._answer = key, child, answer
        return True

    def next(self, key: object) -> tuple[bool, Any]:
        """``(True, item)``: the next item the call under ``key`` yields, once it has;
        ``(False, None)``: no call under that key, or it ended, raised or died."""
        if self._child is None or self.key != key:
            return False, None
        try:
            said, item = self._answer.recv()
        except EOFError:
            said, item = False, None
        if not said:
            self.cancel()
        return said, item

    def cancel(self) -> None:
        """End the running call, if any."""
        if self._child is not None:
            self._child.terminate()
            self._child.join()
            self._answer.close()
        self.key = self._child = self._answer = None


def _answer(fn: Callable[[], Iterator[Any]], send: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    with contextlib.suppress(Exception):  # an error ends the call: the parent goes without
        for item in fn():
            send.send((True, item))
    send.send((False, None))
    send.close()


class Server:
    """A forked child that handles one request at a time for as long as it lives, where
    ``forks()``: forked once, so this process and the child copy the pages they share once,
    not at every request. ``handle(request)`` yields what the child has to say, and
    ``next`` waits for each in turn; ``kill`` ends it (the next ``send`` forks another)."""

    def __init__(self, handle: Callable[[Any], Iterator[Any]]) -> None:
        self.handle = handle
        self._child: Any = None
        self._line: Any = None
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
            self._line, theirs = context.Pipe(duplex=True)
            self._child = context.Process(target=_serve, args=(self.handle, theirs), daemon=True)
            self._child.start()
            theirs.close()
        self._line.send(request)
        self.busy = True
        return True

    def next(self) -> tuple[bool, Any]:
        """``(True, item)``: the next item the request's handling yields; ``(False, None)``:
        it said all (or raised, or the child died)."""
        if not self.busy:
            return False, None
        try:
            said, item = self._line.recv()
        except EOFError:
            self.kill()
            return False, None
        if not said:
            self.busy = False
        return said, item

    def kill(self) -> None:
        if self._child is not None:
            self._child.terminate()
            self._child.join()
            self._line.close()
        self._child = self._line = None
        self.busy = False


def _serve(handle: Callable[[Any], Iterator[Any]], line: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    while True:
        try:
            request = line.recv()
        except EOFError:
            return
        with contextlib.suppress(Exception):  # an error ends the answer: the parent goes on
            for item in handle(request):
                line.send((True, item))
        line.send((False, None))
