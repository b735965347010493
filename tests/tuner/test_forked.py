"""map_forked: each item in its own forked child, results in order, errors raised here."""

from __future__ import annotations

import os

import pytest

from slotune.tuner.forked import forks, map_forked


def test_results_come_back_in_order_from_other_processes() -> None:
    offset = 1000  # a closure's state reaches the children as it is at the fork
    out = map_forked(lambda x: (x + offset, os.getpid()), [3, 1, 2])
    assert [value for value, _ in out] == [1003, 1001, 1002]
    pids = {pid for _, pid in out}
    if forks():
        assert os.getpid() not in pids  # (quick items may all go to one child)
    else:
        assert pids == {os.getpid()}


def test_a_child_s_error_is_raised_here() -> None:
    def fail_on_two(x: int) -> int:
        if x == 2:
            raise ValueError(f"item {x} is bad")
        return x

    with pytest.raises(ValueError, match="item 2 is bad"):
        map_forked(fail_on_two, [1, 2, 3])
    assert map_forked(fail_on_two, [5]) == [5]  # one item: no child


@pytest.mark.skipif(not forks(), reason="runs in this process where it does not fork")
def test_children_run_at_the_same_time() -> None:
    """Each child waits until every other has started: run one after another, they would
    wait forever (the timeout fails the test instead)."""
    import multiprocessing

    ready = multiprocessing.get_context("fork").Barrier(3, timeout=60)

    def meet(x: int) -> int:
        ready.wait()
        return x

    assert map_forked(meet, [0, 1, 2]) == [0, 1, 2]


@pytest.mark.skipif(not forks(), reason="runs in this process where it does not fork")
def test_a_server_answers_request_after_request_from_one_child() -> None:
    from slotune.tuner.forked import Server

    def handle(n: int):
        if n < 0:
            raise ValueError("negative")
        yield os.getpid()
        yield from range(n)

    server = Server(handle)
    answers = []
    for n in (2, 3, -1, 1):
        assert server.send(n)
        answer = []
        while True:
            said, item = server.next()
            if not said:
                break
            answer.append(item)
        answers.append(answer)
    pids = {a[0] for a in answers if a}
    assert len(pids) == 1 and os.getpid() not in pids  # one child, kept across requests
    assert [a[1:] for a in answers] == [[0, 1], [0, 1, 2], [], [0]]  # an error ends one
    server.kill()
    assert server.send(1) and server.next()[1] not in pids  # killed: a new child
    server.kill()


@pytest.mark.skipif(not forks(), reason="runs in this process where it does not fork")
def test_a_child_ends_with_its_killed_parent() -> None:
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import os, time\n"
        "from slotune.tuner.forked import Server\n"
        "def handle(_):\n"
        "    yield os.getpid()\n"
        "    time.sleep(120)\n"
        "    yield 0\n"
        "s = Server(handle)\n"
        "s.send(None)\n"
        "print(s.next()[1], flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.communicate(timeout=30)  # the child held the pipe too: it returns once it ends
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child}"):
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}")


@pytest.mark.skipif(not forks(), reason="runs in this process where it does not fork")
def test_a_forked_map_works_while_this_process_does_other_work() -> None:
    """The children start at once: each says so before ``results`` is asked for (run
    when asked, the waits below would time out)."""
    import multiprocessing

    from slotune.tuner.forked import ForkedMap

    started = multiprocessing.get_context("fork").Semaphore(0)

    def work(x: int) -> int:
        started.release()
        return x * x

    with ForkedMap(work, [1, 2, 3]) as pending:
        assert all(started.acquire(timeout=60) for _ in range(3))
        assert pending.results() == [1, 4, 9]


@pytest.mark.skipif(not forks(), reason="runs in this process where it does not fork")
def test_a_forked_map_left_unasked_ends_its_children() -> None:
    import multiprocessing
    import time

    from slotune.tuner.forked import ForkedMap

    pids = multiprocessing.get_context("fork").Queue()

    def sleep(_: int) -> int:
        pids.put(os.getpid())
        time.sleep(120)
        return 0

    children: list[int] = []
    with pytest.raises(RuntimeError, match="left"), ForkedMap(sleep, [0, 1]):
        children.extend(pids.get(timeout=60) for _ in range(2))
        raise RuntimeError("left before the results")
    assert len(children) == 2
    assert not any(os.path.exists(f"/proc/{pid}") for pid in children)


def test_a_forked_map_where_nothing_forks_computes_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slotune.tuner import forked

    monkeypatch.setattr(forked, "forks", lambda: False)
    done: list[int] = []

    def work(x: int) -> tuple[int, int]:
        done.append(x)
        return x, os.getpid()

    with forked.ForkedMap(work, [1, 2]) as pending:
        assert done == []  # nothing runs before it is asked for
        assert pending.results() == [(1, os.getpid()), (2, os.getpid())]
