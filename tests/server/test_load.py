"""A small version of benchmarks/server_load.py: concurrent streams, a third leaving early,
bounded in time, and nothing left behind in the server or the engine."""

from __future__ import annotations

import asyncio
import time

from slotune.server import simulated_model
from tests.server.conftest import SIM_CONFIG, ServerThread
from tests.server.load import run_load


def test_concurrent_streams_with_a_third_leaving_leave_nothing_behind() -> None:
    engine, served = simulated_model(SIM_CONFIG, gpu="h100", model="llama-3-8b")
    with ServerThread(engine, served) as server:
        load = asyncio.run(
            run_load(
                server.url,
                "llama-3-8b",
                clients=90,
                max_tokens=16,
                prompt="a shared beginning " * 8,
                timeout_s=60,  # raises TimeoutError past it
            )
        )
        assert load.errors == []
        assert (load.completed, load.left) == (60, 30)
        assert all(c.tokens == 16 for c in load.clients if c.completed)
        loop_engine = server.async_engine
        deadline = time.monotonic() + 20

        def settled() -> bool:
            return loop_engine.num_aborted == 30 and not engine.scheduler.requests

        while not server.call(settled) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.call(settled)
        assert server.call(lambda: loop_engine.num_requests) == 0
        assert server.call(lambda: engine.kv_cache.usage) == 0
        assert server.call(lambda: len(engine._used_ids)) == 0
        assert loop_engine.num_step_errors == 0
