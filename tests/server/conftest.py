"""A slotune server on 127.0.0.1 (an ephemeral port) in a background thread, per test module."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from slotune.engine import EngineConfig
from slotune.server import ServedModel, create_app, local_model, simulated_model
from slotune.server.app import ASYNC_ENGINE, make_runner
from slotune.server.async_engine import AsyncEngine

T = TypeVar("T")
A = TypeVar("A", bound="AppThread")

CONFIG = EngineConfig(
    max_num_batched_tokens=64,
    block_size=16,
    max_num_seqs=8,
    max_model_len=1024,
    num_gpu_blocks=256,
)


SIM_CONFIG = EngineConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=2048)


class AppThread:
    """Runs an aiohttp ``app`` (with ``make_runner``) on 127.0.0.1, an ephemeral port, with
    its own event loop in a daemon thread, for the ``with`` block."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop (between its awaits) and return its result."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._runner = make_runner(self.app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self: A) -> A:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class ServerThread(AppThread):
    """Runs ``create_app(engine, served, **options)`` in an ``AppThread``."""

    def __init__(self, engine: Any, served: ServedModel, **options: Any) -> None:
        self.served = served
        options.setdefault("drain_timeout_s", 1.0)  # what a test leaves running is cut
        super().__init__(create_app(engine, served, **options))

    @property
    def async_engine(self) -> AsyncEngine:
        return self.app[ASYNC_ENGINE]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from slotune.engine.model.init_model import init_model

    return init_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


@pytest.fixture(scope="module")
def server(tiny_dir: Path) -> Iterator[ServerThread]:
    engine, served = local_model(CONFIG, tiny_dir, served_model_name="tiny")
    with ServerThread(engine, served) as s:
        yield s


@pytest.fixture(scope="module")
def sim_server() -> Iterator[ServerThread]:
    engine, served = simulated_model(SIM_CONFIG, gpu="h100", model="llama-3-8b")
    with ServerThread(engine, served) as s:
        yield s
