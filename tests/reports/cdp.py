"""A minimal Chrome DevTools Protocol client: enough to load a page and inspect it.

Drives a headless Chromium over its DevTools websocket with aiohttp (a project dependency),
so the report tests need neither selenium nor playwright.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
)


@dataclass
class PageLog:
    """What the page reported while it was open."""

    errors: list[str] = field(default_factory=list)
    requested_urls: list[str] = field(default_factory=list)


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._waiters: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}
        self.log = PageLog()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self._on_event(data["method"], data.get("params", {}))

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            self.log.errors.append("console: " + " ".join(args))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text", "")
            self.log.errors.append(f"exception: {text}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.log.errors.append("log: " + params["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            self.log.requested_urls.append(params.get("request", {}).get("url", ""))
        for future in self._waiters.pop(method, []):
            if not future.done():
                future.set_result(params)

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        await self._ws.send_json({"id": self._next_id, "method": method, "params": params or {}})
        reply = await asyncio.wait_for(future, timeout=60)
        if "error" in reply:
            raise RuntimeError(f"{method} failed: {reply['error']}")
        return reply.get("result", {})

    def expect(self, event: str) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(event, []).append(future)
        return future

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluating {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def navigate(self, url: str, timeout: float = 60) -> None:
        loaded = self.expect("Page.loadEventFired")
        await self.send("Page.navigate", {"url": url})
        await asyncio.wait_for(loaded, timeout=timeout)

    async def wait_for(self, expression: str, timeout: float = 60) -> Any:
        """Poll ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still falsy after {timeout} s")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> None:
        """Full-page PNG."""
        height = await self.evaluate("document.documentElement.scrollHeight")
        width = await self.evaluate("document.documentElement.scrollWidth")
        result = await self.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            },
        )
        path.write_bytes(base64.b64decode(result["data"]))

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()


def _wait_for_port(user_data_dir: Path, process: subprocess.Popen[bytes], timeout: float) -> int:
    port_file = user_data_dir / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with code {process.returncode} before starting")
        if port_file.is_file():
            lines = port_file.read_text().splitlines()
            if lines and lines[0].strip().isdigit():
                return int(lines[0])
        time.sleep(0.05)
    raise TimeoutError(f"chromium wrote no {port_file} within {timeout} s")


@contextlib.asynccontextmanager
async def open_page(
    executable: str, user_data_dir: Path, width: int = 1400, height: int = 1000
) -> AsyncIterator[Page]:
    """Start headless Chromium with a fresh profile and yield its first tab, instrumented."""
    user_data_dir.mkdir(parents=True, exist_ok=True)
    log_file = (user_data_dir.parent / "chromium.log").open("wb")
    process = subprocess.Popen(
        [executable, *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    try:
        port = _wait_for_port(user_data_dir, process, timeout=60)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json(content_type=None)
            url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
            ws = await session.ws_connect(url, max_msg_size=0)
            page = Page(ws)
            try:
                for domain in ("Runtime", "Log", "Page", "Network"):
                    await page.send(f"{domain}.enable")
                await page.send(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                )
                yield page
            finally:
                await page.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()
