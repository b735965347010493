"""Issue 26's server faults: no request, however large or malformed, hurts anything else.

Sizes are refused before anything proportional to them is built; sampling parameters
cannot fail a step; drain keeps its timeout; ``--max-queue`` counts sequences; bodies,
headers and ``Expect`` are bounded and answered as OpenAI errors.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import slotune
from slotune.engine import EngineConfig, SamplingParams
from slotune.engine.model.sampler import Sampler, SampleRow
from slotune.server import ServedModel, simulated_model
from slotune.server.drain import Drain, ShuttingDown
from slotune.server.protocol import (
    MAX_STOP_STRINGS,
    InvalidRequest,
    parse_detokenize,
    parse_request,
)
from tests.server.conftest import SIM_CONFIG, ServerThread
from tests.server.helpers import InnocentStream, assert_openai_error, call, post

C = "/v1/completions"
HI = {"prompt": "hi"}


@pytest.fixture(scope="module")
def sim_served() -> ServedModel:
    return simulated_model(SIM_CONFIG)[1]


# -- 1: every size checked before anything is built per unit of it ------------------------------

SIZES: list[tuple[str, Callable[[ServedModel], dict[str, Any]], str]] = [
    ("n 2**80", lambda s: HI | {"n": 1208925819614629174706176}, "n"),
    ("n a million", lambda s: HI | {"n": 10**6}, "n"),
    ("n past max_num_seqs", lambda s: HI | {"n": (s.max_num_seqs or 0) + 1}, "n"),
    ("5000 prompts", lambda s: {"prompt": ["a"] * 5000}, "prompt"),
    ("prompts x n past the bound", lambda s: {"prompt": ["a"] * 300, "n": 16}, "prompt"),
    ("a million token ids", lambda s: {"prompt": [5] * 10**6}, "prompt"),
    ("a batch holding a long prompt", lambda s: {"prompt": [[5] * 10**6]}, "prompt"),
    ("a million stop strings", lambda s: HI | {"stop": ["x"] * 10**6}, "stop"),
    ("one stop string too many", lambda s: HI | {"stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
    ("a 10k-character stop", lambda s: HI | {"stop": "x" * 10_000}, "stop"),
    (
        "stop_token_ids past the vocabulary",
        lambda s: HI | {"stop_token_ids": [1] * (s.vocab_size + 1)},
        "stop_token_ids",
    ),
    ("best_of 2**80", lambda s: HI | {"best_of": 2**80}, "best_of"),
    ("max_tokens 2**80", lambda s: HI | {"max_tokens": 2**80}, "max_tokens"),
    ("logprobs 2**80", lambda s: HI | {"logprobs": 2**80}, "logprobs"),
    (
        "include_usage a string",
        lambda s: HI | {"stream_options": {"include_usage": "yes"}},
        "stream_options",
    ),
    (
        "include_usage a number",
        lambda s: HI | {"stream_options": {"include_usage": 1}},
        "stream_options",
    ),
]


@pytest.mark.parametrize(("make", "param"), [c[1:] for c in SIZES], ids=[c[0] for c in SIZES])
def test_sizes_are_refused_before_anything_is_built(
    sim_served: ServedModel, make: Callable[[ServedModel], dict[str, Any]], param: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(make(sim_served), sim_served, chat=False)
    assert info.value.param == param
    assert info.value.status == 400


def test_a_million_chat_messages_are_refused_before_rendering(sim_served: ServedModel) -> None:
    body = {"messages": [{"role": "user", "content": ""}] * 10**6}
    with pytest.raises(InvalidRequest) as info:
        parse_request(body, sim_served, chat=True)
    assert info.value.param == "messages"
    assert info.value.code == "context_length_exceeded"


def test_detokenize_is_bounded_by_the_context(sim_served: ServedModel) -> None:
    assert parse_detokenize({"tokens": [5] * 100}, sim_served) == [5] * 100
    with pytest.raises(InvalidRequest) as info:
        parse_detokenize({"tokens": [5] * (sim_served.max_model_len + 1)}, sim_served)
    assert info.value.param == "tokens"


def test_an_unknown_model_name_is_not_echoed_whole(sim_server: ServerThread) -> None:
    status, data, _ = call(sim_server, C, HI | {"model": "m" * 1_000_000})
    assert_openai_error(status, data, 404)
    assert data["error"]["param"] == "model"
    assert len(data["error"]["message"]) < 300


HTTP_SIZES: list[tuple[str, str, dict[str, Any] | bytes, int, str | None]] = [
    ("n 2**80", C, HI | {"n": 1208925819614629174706176}, 400, "n"),
    ("n a million", C, HI | {"n": 10**6}, 400, "n"),
    ("5000 prompts", C, {"prompt": ["a"] * 5000}, 400, "prompt"),
    ("a million stop strings", C, HI | {"stop": ["ab"] * 10**6}, 400, "stop"),
    (
        "include_usage a string",
        C,
        HI | {"stream_options": {"include_usage": "x"}},
        400,
        "stream_options",
    ),
    ("detokenize 3M tokens", "/detokenize", {"tokens": [5] * 3_000_000}, 413, None),
    (
        "detokenize past the context, in few bytes",
        "/detokenize",
        b'{"tokens": [' + b"5," * 3000 + b"5]}",
        400,
        "tokens",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [c[1:] for c in HTTP_SIZES],
    ids=[c[0] for c in HTTP_SIZES],
)
def test_huge_sizes_are_openai_errors_that_stall_no_stream(
    sim_server: ServerThread, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    with InnocentStream(sim_server, max_tokens=40):
        code, data, _ = call(sim_server, path, body, timeout=30)
        assert call(sim_server, "/health", timeout=5)[0] == 200
    assert_openai_error(code, data, status)
    assert data["error"]["param"] == param


# -- 2: sampling parameters cannot fail a step ----------------------------------------------------

TINY_TOP_P = [1e-46, 5e-324, 2.2e-311]


@pytest.mark.parametrize("top_p", TINY_TOP_P)
def test_sampler_keeps_the_most_likely_token_for_any_top_p(top_p: float) -> None:
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    rows = [
        SampleRow("a", SamplingParams(top_p=top_p), 1),
        SampleRow("b", SamplingParams(top_p=top_p, seed=3), 2),
    ]
    out = Sampler().sample(logits, rows)
    best = logits.argmax(dim=-1).tolist()
    assert out[0].token_ids == [best[0]]
    assert out[1].token_ids == [best[1], best[1]]


@pytest.mark.parametrize("top_k", [5, 0])  # 0: the batched draw of plain rows
def test_a_row_without_a_distribution_is_drawn_greedily_and_fails_no_other(top_k: int) -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2))
    logits[0, :] = float("-inf")
    logits[0, 7] = float("nan")
    rows = [SampleRow(r, SamplingParams(top_k=top_k), 1) for r in ("bad", "ok", "ok2")]
    out = Sampler().sample(logits, rows)
    assert len(out[0].token_ids) == 1 and 0 <= out[0].token_ids[0] < 50
    allowed = logits[1:].topk(top_k or 50).indices.tolist()
    assert out[1].token_ids[0] in allowed[0] and out[2].token_ids[0] in allowed[1]


@pytest.mark.parametrize("top_p", TINY_TOP_P)
def test_tiny_top_p_fails_no_concurrent_stream(server: ServerThread, top_p: float) -> None:
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 8, "top_p": top_p}
    with InnocentStream(server, max_tokens=150):
        status, data, _ = call(server, C, body)
        # the greedy answer: top-p keeps the single most likely token
        greedy = call(server, C, body | {"temperature": 0})[1]
    assert status == 200, data
    assert data["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert server.async_engine.num_step_errors == 0


# -- 4: --max-queue counts prompts x n ----------------------------------------------------------


def test_max_queue_counts_prompts_times_n() -> None:
    config = EngineConfig(max_num_batched_tokens=256, max_num_seqs=1, max_model_len=2048)
    engine, served = simulated_model(config, gpu="h100")
    with ServerThread(engine, served, max_queue=2) as s:
        for body, param in (
            ({"prompt": ["a", "b", "c"]}, "prompt"),
            ({"prompt": "a", "n": 3}, "n"),
        ):
            status, data, _ = call(s, C, body | {"max_tokens": 1})
            assert_openai_error(status, data, 400)  # alone more than the queue holds
            assert data["error"]["param"] == param
        with InnocentStream(s, max_tokens=200):  # holds the only seat
            waiting = _open_stream(s, {"prompt": "w", "max_tokens": 1})  # one waits
            _wait_for(lambda: s.call(lambda: s.async_engine.num_waiting) == 1)
            status, data, headers = call(s, C, {"prompt": ["a", "b"], "max_tokens": 1})
            assert_openai_error(status, data, 503)  # 1 waiting + 2 > 2
            assert headers["Retry-After"] == "1"
            peak = s.call(lambda: s.async_engine.num_waiting)
        assert b"[DONE]" in waiting.read()
        assert peak <= 2
        assert call(s, C, {"prompt": ["a", "b"], "max_tokens": 1})[0] == 200


def _open_stream(server: ServerThread, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        server.url + C,
        data=json.dumps(body | {"stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    return urllib.request.urlopen(req, timeout=30)


def _wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# -- bodies, headers and Expect -------------------------------------------------------------------

BODY = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
ENCODED: list[tuple[str, str, bytes, int]] = [
    ("gzip", "gzip", gzip.compress(BODY), 200),
    ("deflate", "deflate", zlib.compress(BODY), 200),
    ("gzip header on a plain body", "gzip", BODY, 400),
    ("truncated gzip", "gzip", gzip.compress(BODY)[:20], 400),
    ("brotli", "br", BODY, 415),
    ("unknown", "x-what", BODY, 415),
]


@pytest.mark.parametrize(
    ("encoding", "raw", "status"), [c[1:] for c in ENCODED], ids=[c[0] for c in ENCODED]
)
def test_content_encoding_is_decoded_or_refused(
    sim_server: ServerThread, encoding: str, raw: bytes, status: int
) -> None:
    code, data, _ = call(sim_server, C, raw, headers={"Content-Encoding": encoding})
    if status == 200:
        assert code == 200, data
        assert data["usage"]["completion_tokens"] == 2
    else:
        assert_openai_error(code, data, status)


def test_a_gzip_bomb_is_bounded_by_the_body_limit() -> None:
    engine, served = simulated_model(SIM_CONFIG, gpu="h100")
    bomb = gzip.compress(b'{"prompt": "' + b"a" * 5_000_000 + b'"}')
    with ServerThread(engine, served, max_body_bytes=100_000) as s:
        code, data, _ = call(s, C, bomb, headers={"Content-Encoding": "gzip"})
    assert_openai_error(code, data, 413)


def test_a_non_utf8_authorization_header_is_a_401() -> None:
    engine, served = simulated_model(SIM_CONFIG, gpu="h100")
    with ServerThread(engine, served, api_key="k") as s:
        # http.client sends header values as Latin-1: a raw 0xE9 byte
        code, data, _ = call(s, "/v1/models", headers={"Authorization": "Bearer caf\xe9"})
        assert_openai_error(code, data, 401)
        assert call(s, "/v1/models", headers={"Authorization": "Bearer k"})[0] == 200


def _raw(server: ServerThread, request: bytes, timeout: float = 10) -> bytes:
    """Send bytes on a new connection; everything the server answers until it closes or
    goes quiet for ``timeout``."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and b"Content-Length" in chunks[0]:
                    head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    if len(rest) >= length:
                        break
        except TimeoutError:
            pass
    return b"".join(chunks)


def _status_and_json(answer: bytes) -> tuple[int, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def test_expect_100_continue_refuses_a_body_over_the_limit(sim_server: ServerThread) -> None:
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10000000000\r\nExpect: 100-continue\r\n\r\n"
    )
    answer = _raw(sim_server, request)
    assert not answer.startswith(b"HTTP/1.1 100"), answer[:100]
    status, data = _status_and_json(answer)
    assert_openai_error(status, data, 413)


def test_expect_100_continue_still_continues_for_a_fine_body(sim_server: ServerThread) -> None:
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n" % len(BODY)
    )
    with socket.create_connection(("127.0.0.1", sim_server.port), timeout=10) as sock:
        sock.sendall(head)
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(BODY)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200")


def test_a_body_that_never_arrives_is_a_408() -> None:
    engine, served = simulated_model(SIM_CONFIG, gpu="h100")
    with ServerThread(engine, served, body_read_s=0.5) as s:
        request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"prompt": '
        )
        status, data = _status_and_json(_raw(s, request, timeout=10))
        assert_openai_error(status, data, 408)
        assert call(s, "/health")[0] == 200


@pytest.mark.slow
def test_headers_that_never_end_close_the_connection(sim_server: ServerThread) -> None:
    """aiohttp's keep-alive timer (``KEEPALIVE_S``) also closes a connection whose
    request never completes its headers."""
    from slotune.server.app import KEEPALIVE_S

    with socket.create_connection(("127.0.0.1", sim_server.port), timeout=KEEPALIVE_S + 20) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        start = time.monotonic()
        assert sock.recv(100) == b""  # closed by the server, not by our timeout
    assert time.monotonic() - start < KEEPALIVE_S + 15


H = b" HTTP/1.1\r\nHost: x\r\n"
POST_C = b"POST /v1/completions" + H
PARSER_ERRORS = [
    ("duplicate Content-Length", POST_C + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
    ("negative Content-Length", POST_C + b"Content-Length: -1\r\n\r\n"),
    ("NUL in the path", b"GET /he\x00alth" + H + b"\r\n"),
    ("bad method", b"G@T /health" + H + b"\r\n"),
    ("bad version", b"GET /health HTTP/9.Z\r\nHost: x\r\n\r\n"),
    ("space in a header name", b"GET /health" + H + b"X Y: 1\r\n\r\n"),
    ("request line too long", b"GET /" + b"a" * 20_000 + H + b"\r\n"),
    (
        "Content-Length with chunked",
        POST_C + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ),
    ("bad chunk size", POST_C + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n\r\n"),
]


def _until_closed(server: ServerThread, request: bytes) -> bytes:
    """Send bytes on a new connection; everything the server answers until it closes the
    connection (a ``TimeoutError`` if it does not within 10 s)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "request_bytes", [c[1] for c in PARSER_ERRORS], ids=[c[0] for c in PARSER_ERRORS]
)
def test_parser_errors_are_openai_400s_that_close_and_hurt_nothing(
    sim_server: ServerThread, request_bytes: bytes
) -> None:
    """aiohttp's HTTP parser refuses these before any handler runs."""
    with InnocentStream(sim_server, max_tokens=30):
        answer = _until_closed(sim_server, request_bytes)  # closed, as aiohttp does
        assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 ")), answer[:100]
        assert b"\r\ncontent-type: application/json" in answer.lower(), answer[:300]
        status, data = _status_and_json(answer)
        assert_openai_error(status, data, 400)
        assert len(data["error"]["message"]) < 300  # the request's bytes are not echoed whole
        assert call(sim_server, "/health")[0] == 200


def test_an_error_outside_the_middlewares_is_a_generic_openai_500() -> None:
    """An exception no middleware catches (here an ``Expect`` handler's) gets aiohttp's
    500 from ``handle_error``: an OpenAI error without the exception's text."""

    async def fail(request: Any) -> None:
        raise RuntimeError("secret detail")

    engine, served = simulated_model(SIM_CONFIG, gpu="h100")
    server = ServerThread(engine, served)
    server.app.router.add_post("/fail", fail, expect_handler=fail)
    with server as s:
        request = b"POST /fail" + H + b"Content-Length: 2\r\nExpect: 100-continue\r\n\r\n{}"
        answer = _until_closed(s, request)
        status, data = _status_and_json(answer)
        assert_openai_error(status, data, 500)
        assert b"secret" not in answer and b"Traceback" not in answer
        assert call(s, "/health")[0] == 200


def test_an_aiohttp_without_the_hooks_still_serves_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from aiohttp import web

    from slotune.server.app import make_runner

    def handle_error(self: Any, request: Any, status: int = 500) -> None: ...

    monkeypatch.setattr(web.RequestHandler, "handle_error", handle_error)
    runner = make_runner(web.Application())
    assert type(runner) is web.AppRunner  # plain aiohttp: its own parser errors
    assert any("changed" in r.message and "handle_error" in r.message for r in caplog.records)


# -- 3: drain keeps its word ---------------------------------------------------------------------


def _events(stream: Any) -> list[bytes]:
    """The ``data:`` payloads of a server-sent event stream, until it ends."""
    events = []
    try:
        for line in stream:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
    except OSError:  # cut without an end
        events.append(b"<connection broken>")
    return events


@pytest.mark.parametrize("timeout_s", [0.0, 3.0])
def test_drain_cuts_streams_at_its_timeout_with_an_error_then_done(timeout_s: float) -> None:
    from tests.server.test_endpoints import _Served

    with _Served("--drain-timeout", str(timeout_s)) as server:
        body = {"prompt": "long", "max_tokens": 8000, "ignore_eos": True}
        stream = _open_stream(server, body)  # type: ignore[arg-type]
        assert stream.readline().startswith(b"data: ")  # the first token: it runs
        server.proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        events = _events(stream)
        cut_after = time.monotonic() - start
        assert server.proc.wait(timeout=20) == 0
    assert events[-1] == b"[DONE]", events[-3:]
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "drain timeout" in error["message"]
    # the 8000-token stream would run ~40 s; aiohttp took twice the timeout (6 s for 3), or
    # forever for 0
    assert timeout_s - 0.5 <= cut_after < timeout_s + 2.5, cut_after


# -- memory: freed request buffers go back to the system -----------------------------------------

_HEAP_SCRIPT = """
import gc, sys
from pathlib import Path
from slotune.server.memory import keep_large_blocks_mapped

def rss_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

assert keep_large_blocks_mapped()
big = bytearray(20 << 20)  # a 20 MB body freed: glibc would raise its mmap threshold to it
big[::4096] = b"x" * len(big[::4096])
del big
before = rss_mb()
blocks = [bytearray(1 << 20) for _ in range(50)]  # then 50 MB of 1 MB buffers, freed
for b in blocks:
    b[::4096] = b"x" * len(b[::4096])
top = bytearray(1000)  # something allocated after them, on top of the heap
del blocks
gc.collect()
print(rss_mb() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_freed_large_buffers_leave_the_rss(tmp_path: Path) -> None:
    """Without ``keep_large_blocks_mapped`` the 50 MB stay in the heap (RSS +50 MB)."""
    env = os.environ | {"PYTHONPATH": str(Path(slotune.__file__).parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", _HEAP_SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    assert float(out.stdout) < 10, out.stdout


def test_drain_returns_as_soon_as_requests_finish_and_cuts_the_rest() -> None:
    async def scenario() -> tuple[list[Any], list[Any]]:
        drain = Drain(timeout_s=30)
        finished: asyncio.Queue[Any] = asyncio.Queue()
        with drain.track(finished):
            pass  # a request that ended before shutdown
        await asyncio.wait_for(drain.run(), 5)  # nothing in flight: no wait
        cut = Drain(timeout_s=0)
        running: asyncio.Queue[Any] = asyncio.Queue()
        with cut.track(running):
            await asyncio.wait_for(cut.run(), 5)
        return [finished.get_nowait() for _ in range(finished.qsize())], [running.get_nowait()]

    left, cut = asyncio.run(scenario())
    assert left == []
    assert isinstance(cut[0], ShuttingDown) and "0 s" in str(cut[0])


def test_a_non_streamed_request_cut_by_the_drain_gets_a_503() -> None:
    engine, served = simulated_model(SIM_CONFIG, gpu="h100")
    answers: list[tuple[int, Any]] = []
    server = ServerThread(engine, served, drain_timeout_s=0)
    with server:
        body = {"prompt": "x", "max_tokens": 1500, "ignore_eos": True}
        worker = threading.Thread(target=lambda: answers.append(post(server, C, body)))
        worker.start()
        _wait_for(lambda: server.call(lambda: server.async_engine.num_requests) == 1)
    worker.join(10)
    status, data = answers[0]
    assert_openai_error(status, data, 503)
    assert "drain timeout" in data["error"]["message"]
