"""The HTTP target against a small aiohttp server in the test that streams SSE."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pandas as pd
import pytest
from aiohttp import web

from slotune.workloads import ArrivalSpec, Trace, TraceRequest, run_http, summarize
from slotune.workloads.runner.http import endpoint_url


class _Server:
    """Streams ``max_tokens`` chunks of "tok " 5 ms apart. A prompt containing FAIL gets an
    HTTP 500, DROP gets the connection closed mid-stream, STALL never answers."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        chat = request.path.endswith("chat/completions")
        text = body["messages"][-1]["content"] if chat else body["prompt"]
        if "FAIL" in text:
            return web.Response(status=500, text="internal error: FAIL requested")
        if "STALL" in text:
            await asyncio.sleep(3)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = body["max_tokens"]
        for k in range(n):
            if "DROP" in text and k == 2:
                request.transport.close()
                return resp
            delta = {"delta": {"content": "tok "}} if chat else {"text": "tok "}
            await resp.write(
                f"data: {json.dumps({'choices': [{'index': 0, **delta}]})}\n\n".encode()
            )
            await asyncio.sleep(0.005)
        usage = {
            "prompt_tokens": len(text),
            "completion_tokens": n,
            "prompt_tokens_details": {"cached_tokens": 3},
        }
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    def __enter__(self) -> _Server:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    with _Server() as s:
        yield s


def _trace(texts: list[str], output: int = 4) -> Trace:
    reqs = tuple(
        TraceRequest(
            request_id=f"r{i}",
            prompt_len=len(t.encode()),
            output_len=output,
            prompt_token_ids=tuple(t.encode()),
            prompt_text=t,
        )
        for i, t in enumerate(texts)
    )
    return Trace(name="http", requests=reqs)


def test_endpoint_url() -> None:
    assert endpoint_url("http://h:1", "completions") == "http://h:1/v1/completions"
    assert endpoint_url("http://h:1/v1/", "chat") == "http://h:1/v1/chat/completions"
    assert endpoint_url("http://h:1/v1/completions", "chat") == "http://h:1/v1/completions"


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streams_tokens_and_records_errors_without_aborting(server: _Server, endpoint: str) -> None:
    trace = _trace(["hello there", "please FAIL now", "DROP me", "and another one", "last"])
    res = run_http(
        f"http://127.0.0.1:{server.port}",
        trace,
        ArrivalSpec(rate=200, constant=True),
        model="m",
        endpoint=endpoint,
        timeout_s=10,
    )
    df = res.requests.set_index("request_id")
    assert df.loc["r1", "error"].startswith("HTTP 500: internal error")
    assert df.loc["r2", "error"] is not None and len(df.loc["r2", "token_times"]) == 2
    good = df.drop(index=["r1", "r2"])
    assert good["error"].isna().all()
    assert (good["output_tokens"] == 4).all()
    assert all(len(ts) == 4 for ts in good["token_times"])
    assert (good["first_token_time"] > good["arrival_time"]).all()
    assert (good["cached_tokens"] == 3).all()
    s = summarize(res)
    assert (s["completed"], s["failed"]) == (3, 2)
    assert 4.0 < s["itl_ms"]["p50"] < 200.0
    body = server.bodies[-1]
    assert body["stream"] is True and body["max_tokens"] == 4 and body["ignore_eos"] is True
    assert ("messages" in body) == (endpoint == "chat")


def test_timeout_is_recorded(server: _Server) -> None:
    res = run_http(
        f"http://127.0.0.1:{server.port}", _trace(["STALL", "fine"]), model="m", timeout_s=0.5
    )
    df = res.requests.set_index("request_id")
    assert df.loc["r0", "error"] == "timeout"
    waited = df.loc["r0", "finish_time"] - df.loc["r0", "arrival_time"]
    assert 0.5 <= waited < 3.0  # given up at the timeout, before the server answers (3 s)
    assert pd.isna(df.loc["r1", "error"])


def test_connection_refused_is_recorded() -> None:
    res = run_http("http://127.0.0.1:9", _trace(["a", "b"]), model="m", timeout_s=2)
    assert res.requests["error"].notna().all()
    assert summarize(res)["failed"] == 2


def test_chat_session_sends_history_with_the_servers_answers(server: _Server) -> None:
    reqs = (
        TraceRequest(request_id="t0", prompt_len=2, output_len=2, prompt_text="hi", session_id="s"),
        TraceRequest(
            request_id="t1",
            prompt_len=3,
            output_len=3,
            prompt_text="and",
            session_id="s",
            turn=1,
            think_time_s=0.05,
            parent_id="t0",
        ),
    )
    server.bodies.clear()
    res = run_http(
        f"http://127.0.0.1:{server.port}",
        Trace(name="s", requests=reqs),
        model="m",
        endpoint="chat",
        timeout_s=10,
    )
    assert res.requests["error"].isna().all()
    assert server.bodies[-1]["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "tok tok "},
        {"role": "user", "content": "and"},
    ]
    df = res.requests.set_index("request_id")
    assert df.loc["t1", "arrival_time"] >= df.loc["t0", "finish_time"] + 0.05 - 1e-9


def test_bench_command_against_the_server(server: _Server, tmp_path) -> None:
    from typer.testing import CliRunner

    from slotune.cli.app import app

    out = tmp_path / "http-run"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--backend",
            "http",
            "--url",
            f"http://127.0.0.1:{server.port}",
            "--endpoint",
            "chat",
            "--model",
            "served",
            "--trace",
            "long-context",
            "--num-requests",
            "3",
            "--concurrency",
            "2",
            "--slo",
            "ttft=1s",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 3 and summary["config"] is None
    assert summary["backend"] == "http" and summary["slo_attainment"] == 1.0
    assert server.bodies[-1]["model"] == "served"
