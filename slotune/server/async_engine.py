"""The engine behind an event loop: one task steps it, requests talk to it through queues.

Only the loop task touches the engine. Handlers hand it requests, aborts and prefix-cache
resets through an inbox; it applies them between steps, runs each ``step()`` in its own
daemon thread (the event loop keeps serving meanwhile, and a step that never returns cannot
keep the process from exiting) and puts every ``RequestOutput`` on its request's queue. With
``pace`` (a simulated engine) it releases a step's tokens only once the step's virtual
duration has passed since the previous step ended, or since its requests entered (see
``_paced_release``), so that clients observe the simulated latencies. A failing step
fails the requests it held, not the loop.
With ``metrics`` it reports every admission, step, output and abort, timed by ``now()``: the
loop's clock, or the virtual clock when pacing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slotune.engine.engine import Engine
from slotune.engine.outputs import RequestOutput
from slotune.engine.sampling_params import SamplingParams
from slotune.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """The engine failed while running a request (a server error, not the client's)."""


@dataclass
class _Pending:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    admitted: asyncio.Future[None]
    outputs: asyncio.Queue[RequestOutput | EngineError] = field(default_factory=asyncio.Queue)
    priority: int = 0
    entered_at: float = 0.0  # loop time


@dataclass
class _Reset:
    done: asyncio.Future[bool]


@dataclass
class _Stream:
    outputs: asyncio.Queue[RequestOutput | EngineError]
    open_completions: int


class _StepThread:
    """One daemon thread that runs the calls it is given, one at a time."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None]
        self._calls = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="slotune-step", daemon=True)
        self._thread.start()

    def run(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self._calls.put((fn, future))
        return future

    def close(self) -> None:
        self._calls.put(None)

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, future = call
            try:
                result, error = fn(), None
            except BaseException as exc:  # handed to the awaiting task
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                future.get_loop().call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class AsyncEngine:
    def __init__(
        self,
        engine: Engine,
        *,
        pace: bool = False,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.pace = pace
        self.metrics = metrics
        self.num_aborted = 0
        self.num_step_errors = 0
        self.virtual_time_s = 0.0  # sum of the step durations the engine reported
        self._inbox: deque[_Pending | tuple[str, bool] | _Reset] = deque()
        self._streams: dict[str, _Stream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._step_started: float | None = None  # loop time the running step began

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._steps = _StepThread()
            self._task = asyncio.create_task(self._run(), name="slotune-engine-loop")

    async def stop(self) -> None:
        """Stop the loop at once, even while a step runs (its thread is left to finish)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._steps.close()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def step_running_s(self) -> float:
        """How long the step now running has run (0 between steps)."""
        started = self._step_started
        return 0.0 if started is None else asyncio.get_running_loop().time() - started

    @property
    def num_waiting(self) -> int:
        """Sequences not yet running, handed in but not admitted or waiting in the engine:
        a request not yet forked counts ``n``."""
        pending = sum(item.params.n for item in self._inbox if isinstance(item, _Pending))
        return pending + sum(r.seats for r in self.engine.scheduler.waiting)

    @property
    def num_requests(self) -> int:
        """Requests the loop serves (admitted, not yet finished or aborted)."""
        return len(self._streams)

    def now(self) -> float:
        """The clock of metrics: virtual seconds when pacing a simulated engine."""
        return self.virtual_time_s if self.pace else asyncio.get_running_loop().time()

    # -- what handlers call --------------------------------------------------------------------

    async def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        outputs: asyncio.Queue[RequestOutput | EngineError] | None = None,
        priority: int = 0,
    ) -> asyncio.Queue[RequestOutput | EngineError]:
        """Queue a request; returns its output queue (``outputs``, which several requests
        may share, or a new one) once the engine accepted it. Raises the engine's
        ``ValueError`` when it refuses the request."""
        outputs = outputs if outputs is not None else asyncio.Queue()
        await self.submit(request_id, prompt_token_ids, params, outputs, priority)
        return outputs

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        outputs: asyncio.Queue[RequestOutput | EngineError],
        priority: int = 0,
        entered_at: float | None = None,
    ) -> asyncio.Future[None]:
        """Queue a request now (it counts in ``num_waiting`` at once); the future is done
        when the engine accepted it, or holds the engine's ``ValueError``. ``priority``
        goes to the scheduler (lower first under priority scheduling). ``entered_at``: the
        loop time the request counts as handed in when pacing (by default now; earlier for
        a handler whose own work the simulated stack's per-request latency covers)."""
        if not self.running:
            raise EngineError("the engine loop is not running")
        loop = asyncio.get_running_loop()
        admitted = loop.create_future()
        entered = loop.time() if entered_at is None else entered_at
        pending = _Pending(
            request_id, prompt_token_ids, params, admitted, outputs, priority, entered
        )
        self._inbox.append(pending)
        self._wake.set()
        return admitted

    async def reset_prefix_cache(self) -> bool:
        """Drop the engine's prefix cache between steps; False while it serves requests."""
        if not self.running:
            raise EngineError("the engine loop is not running")
        reset = _Reset(asyncio.get_running_loop().create_future())
        self._inbox.append(reset)
        self._wake.set()
        return await reset.done

    def abort(self, request_id: str, finished: bool = False) -> None:
        """Stop a request (all its completions); its queue gets nothing more. ``finished``:
        the request is complete for its client (a stop string ended it), not abandoned."""
        self._inbox.append((request_id, finished))
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        release = 0.0
        while True:
            entered = self._drain()
            self._report_state()
            if not self.engine.has_unfinished_requests():
                self._wake.clear()
                if not self._inbox:
                    await self._wake.wait()
                continue
            start, clock_start = loop.time(), self.now()
            self._step_started = start
            try:
                outputs = await self._steps.run(self.engine.step)
            except Exception as exc:
                logger.exception("engine step failed; failing the requests it held")
                self.num_step_errors += 1
                self._fail_all(exc)
                continue
            finally:
                self._step_started = None
            step = self.engine.last_step
            if self.metrics is not None:
                self.metrics.stepped(self.engine, clock_start, step.duration_s if step else 0.0)
            if step is not None:
                self.virtual_time_s += step.duration_s
                if self.pace:
                    release = self._paced_release(release, entered, step.duration_s)
                    delay = release - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
            self._dispatch(outputs)
            self._report_state()

    def _report_state(self) -> None:
        if self.metrics is not None:
            self.metrics.engine_state(self.engine, self._num_pending())

    def _num_pending(self) -> int:
        return sum(1 for item in self._inbox if isinstance(item, _Pending))

    @staticmethod
    def _paced_release(previous: float, entered: float | None, duration_s: float) -> float:
        """When a step's tokens are due. A step begins where the previous one ended, or, if
        it takes in new requests, once the last of them entered (they cannot be served
        before they came); so the server's own overhead (between busy steps, and from a
        request's arrival to its first step) does not add up as latency."""
        return (previous if entered is None else max(previous, entered)) + duration_s

    def _drain(self) -> float | None:
        """Add and abort what handlers sent; when the last request added entered (None:
        none was)."""
        entered: float | None = None
        while self._inbox:
            item = self._inbox.popleft()
            if isinstance(item, tuple):
                self._abort(*item)
            elif isinstance(item, _Reset):
                if not item.done.done():
                    item.done.set_result(self.engine.reset_prefix_cache())
            elif self._admit(item):
                entered = item.entered_at if entered is None else max(entered, item.entered_at)
        return entered

    def _admit(self, p: _Pending) -> bool:
        if p.admitted.done():  # its handler is gone (the client left before admission)
            return False
        try:
            self.engine.add_request(p.request_id, p.prompt_token_ids, p.params, priority=p.priority)
        except ValueError as exc:
            p.admitted.set_exception(exc)
            return False
        self._streams[p.request_id] = _Stream(p.outputs, p.params.n)
        if self.metrics is not None:
            self.metrics.admitted(p.request_id, len(p.prompt_token_ids), p.params.n, self.now())
        p.admitted.set_result(None)
        return True

    def _abort(self, request_id: str, finished: bool) -> None:
        if self._streams.pop(request_id, None) is None:
            return
        self.engine.abort_request(request_id)
        self.engine.forget_request_id(request_id)
        if self.metrics is not None:
            self.metrics.aborted(request_id, self.now(), finished)
        self.num_aborted += not finished

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        streams = self._streams
        now = self.now()
        for out in outputs:
            stream = streams.get(out.request_id)
            if stream is None:
                continue
            if self.metrics is not None:
                self.metrics.output(out, now)
            stream.outputs.put_nowait(out)
            if out.finished:
                stream.open_completions -= 1
                if stream.open_completions <= 0:
                    del streams[out.request_id]
                    self.engine.forget_request_id(out.request_id)

    def _fail_all(self, exc: Exception) -> None:
        error = EngineError(f"engine step failed: {type(exc).__name__}: {exc}")
        streams, self._streams = self._streams, {}
        for request_id, stream in streams.items():
            stream.outputs.put_nowait(error)
            if self.metrics is not None:
                self.metrics.aborted(request_id, self.now(), finished=False)
            try:
                self.engine.abort_request(request_id)
                self.engine.forget_request_id(request_id)
            except Exception:  # the engine's state is suspect after a failed step
                logger.exception("abort of %s after a failed step", request_id)

    def __repr__(self) -> str:
        state: Any = "running" if self.running else "stopped"
        return f"AsyncEngine({state}, {len(self._streams)} requests, pace={self.pace})"
