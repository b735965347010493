"""vLLM's ``priority`` extra parameter through the HTTP server: passed to the scheduler
(lower served first under priority scheduling), refused with an OpenAI-style 400 when
malformed or when the server schedules FCFS (as vLLM does)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from slotune.engine import EngineConfig
from slotune.server import simulated_model
from tests.server.conftest import ServerThread
from tests.server.helpers import post

ONE_SEAT = EngineConfig(
    max_num_batched_tokens=256, max_num_seqs=1, max_model_len=2048, scheduling_policy="priority"
)


@pytest.fixture(scope="module")
def priority_server() -> Iterator[ServerThread]:
    engine, served = simulated_model(ONE_SEAT, gpu="h100", model="llama-3-8b")
    with ServerThread(engine, served) as s:
        yield s


def _body(max_tokens: int, priority: object = None) -> dict:
    body = {
        "model": "llama-3-8b",
        "prompt": "hi there",
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    if priority is not None:
        body["priority"] = priority
    return body


def test_waiting_requests_are_served_in_priority_order(priority_server: ServerThread) -> None:
    """One seat: while a long request holds it, four requests queue in the order sent
    (priorities 3, 1, 2, 0); they finish lowest priority value first, not in that order."""
    server = priority_server
    finished: list[tuple[float, int]] = []
    statuses: list[int] = []

    def send(max_tokens: int, priority: int) -> None:
        status, _ = post(server, "/v1/completions", _body(max_tokens, priority))
        statuses.append(status)
        finished.append((time.perf_counter(), priority))

    def waiting() -> int:
        return server.call(lambda: server.async_engine.num_waiting)

    blocker = threading.Thread(target=send, args=(150, 0))
    blocker.start()
    deadline = time.monotonic() + 10
    while not server.call(lambda: server.async_engine.num_requests) and time.monotonic() < deadline:
        time.sleep(0.005)
    threads = []
    for i, priority in enumerate((3, 1, 2, 0)):
        t = threading.Thread(target=send, args=(40, priority))
        t.start()
        threads.append(t)
        while waiting() < i + 1 and time.monotonic() < deadline:  # queued in this order
            time.sleep(0.002)
    blocker.join(30)
    for t in threads:
        t.join(30)
    assert statuses == [200] * 5
    queued = [p for _, p in sorted(finished)][1:]  # the blocker finishes first
    assert queued == [0, 1, 2, 3]


@pytest.mark.parametrize("value", ["high", 1.5, True, 2**40, [1]])
def test_a_bad_priority_gets_a_400_naming_it(priority_server: ServerThread, value: object) -> None:
    status, body = post(priority_server, "/v1/completions", _body(2, value))
    assert status == 400
    assert body["error"]["param"] == "priority"
    assert body["error"]["type"] == "invalid_request_error"
    assert "'priority' must be an integer" in body["error"]["message"]


def test_priority_under_fcfs_is_refused_as_vllm_does(sim_server: ServerThread) -> None:
    status, body = post(sim_server, "/v1/completions", _body(2, 1))
    assert status == 400 and body["error"]["param"] == "priority"
    assert "priority scheduling is not enabled" in body["error"]["message"]
    status, _ = post(sim_server, "/v1/completions", _body(2, 0))  # 0 is the default: fine
    assert status == 200
