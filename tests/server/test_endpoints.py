"""vLLM's other endpoints, the API key, the queue limit, body limits and draining on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from aiohttp import web

import slotune
from slotune.engine import EngineConfig
from slotune.server import simulated_model
from slotune.workloads.server_process import free_port
from tests.server.conftest import CONFIG, SIM_CONFIG, AppThread, ServerThread
from tests.server.helpers import InnocentStream, assert_openai_error, call


def test_tokenize_and_detokenize_match_the_checkpoints_tokenizer(
    server: ServerThread, tiny_dir: Path
) -> None:
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    text = "Hello naïve world 🎉"
    status, data, _ = call(server, "/tokenize", {"model": "tiny", "prompt": text})
    assert status == 200, data
    assert data["tokens"] == reference.encode(text).ids
    assert data["count"] == len(data["tokens"]) and data["max_model_len"] == CONFIG.max_model_len
    plain = call(server, "/tokenize", {"prompt": text, "add_special_tokens": False})[1]
    assert plain["tokens"] == reference.encode(text, add_special_tokens=False).ids
    status, data, _ = call(server, "/detokenize", {"model": "tiny", "tokens": plain["tokens"]})
    assert status == 200 and data == {"prompt": text}
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    ids = call(server, "/tokenize", chat)[1]["tokens"]
    assert ids == reference.encode("user: hi\nassistant:").ids


def test_version_and_model_card(server: ServerThread) -> None:
    assert call(server, "/version")[1] == {"version": slotune.__version__}
    status, card, _ = call(server, "/v1/models/tiny")
    assert status == 200 and card["id"] == "tiny" and card["max_model_len"] == 1024
    listed = call(server, "/v1/models")[1]["data"]
    assert [m["id"] for m in listed] == ["tiny"]


def test_api_key_is_required_on_v1_only() -> None:
    engine, served = simulated_model(SIM_CONFIG, gpu="h100")
    with ServerThread(engine, served, api_key="s3cret") as s:
        status, data, _ = call(s, "/v1/models")
        assert_openai_error(status, data, 401)
        status, data, _ = call(s, "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert_openai_error(status, data, 401)
        assert call(s, "/health")[0] == 200 and call(s, "/metrics")[0] == 200
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret", max_retries=0)
        r = client.completions.create(model="llama-3-8b", prompt="hi", max_tokens=3)
        assert r.usage is not None and r.usage.completion_tokens == 3


def test_a_full_queue_answers_503_with_retry_after() -> None:
    config = EngineConfig(max_num_batched_tokens=256, max_num_seqs=1, max_model_len=2048)
    engine, served = simulated_model(config, gpu="h100")
    with ServerThread(engine, served, max_queue=1) as s:
        running = InnocentStream(s, max_tokens=120).__enter__()  # holds the only seat
        body = {"prompt": "hi", "max_tokens": 1}
        waiting = urllib.request.urlopen(
            urllib.request.Request(
                s.url + "/v1/completions",
                data=json.dumps(body | {"stream": True}).encode(),
                headers={"Content-Type": "application/json"},
            ),
            timeout=30,
        )
        deadline = time.monotonic() + 10
        while s.call(lambda: s.async_engine.num_waiting) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, data, headers = call(s, "/v1/completions", body)
        assert_openai_error(status, data, 503)
        assert headers["Retry-After"] == "1"
        running.__exit__(None, None, None)  # the running one ends; the waiting one is served
        assert b"[DONE]" in waiting.read()
        assert call(s, "/v1/completions", body)[0] == 200


def test_a_body_over_the_limit_is_a_413() -> None:
    engine, served = simulated_model(SIM_CONFIG, gpu="h100")
    with ServerThread(engine, served, max_body_bytes=1000) as s:
        status, data, _ = call(s, "/v1/completions", {"prompt": "x" * 2000})
        assert_openai_error(status, data, 413)
        assert call(s, "/v1/completions", {"prompt": "x" * 10, "max_tokens": 2})[0] == 200


class _Served:
    """A server started as a ``slotune serve --gpu h100`` process."""

    def __init__(self, *flags: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.served = simulated_model(SIM_CONFIG)[1]  # what InnocentStream reads: the name
        cmd = [sys.executable, "-c", "from slotune.cli.app import main; main()", "serve"]
        env = os.environ | {"PYTHONPATH": str(Path(slotune.__file__).parents[1])}
        self.proc = subprocess.Popen(
            [*cmd, "--gpu", "h100", "--port", str(port), *flags],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def __enter__(self) -> _Served:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return self
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_sigterm_drains_requests_in_flight_then_exits() -> None:
    with _Served("--drain-timeout", "20") as server:
        with InnocentStream(server, max_tokens=200):  # type: ignore[arg-type]
            server.proc.send_signal(signal.SIGTERM)
            start = time.monotonic()
        # the stream ran to its end (InnocentStream checked that), then the server left
        assert server.proc.wait(timeout=25) == 0
        assert time.monotonic() - start < 25


def test_sigterm_exits_within_the_drain_timeout() -> None:
    with _Served("--drain-timeout", "1") as server:
        stream = InnocentStream(server, max_tokens=1900)  # type: ignore[arg-type]
        # the server cuts the stream after the drain timeout
        with pytest.raises(openai.APIError), stream:
            server.proc.send_signal(signal.SIGTERM)
            start = time.monotonic()
        assert server.proc.wait(timeout=15) == 0
        assert time.monotonic() - start < 15


def test_a_second_sigterm_stops_without_waiting_for_the_drain() -> None:
    with _Served("--drain-timeout", "60") as server:
        stream = InnocentStream(server, max_tokens=1900)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError), stream:
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(1)
            assert server.proc.poll() is None  # draining
            server.proc.send_signal(signal.SIGTERM)
            start = time.monotonic()
        assert server.proc.wait(timeout=15) == 0
        assert time.monotonic() - start < 15


def test_slotune_serve_answers_parser_errors_as_openai_errors() -> None:
    with _Served() as server:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /he\x00alth HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):  # until the server closes the connection
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert_openai_error(int(head.split()[1]), json.loads(body), 400)


def test_reset_prefix_cache_serves_the_next_prompt_cold_and_waits_for_idle() -> None:
    from slotune.workloads.server_process import reset_prefix_cache

    engine, served = simulated_model(SIM_CONFIG, gpu="h100")
    prompt = "the same long prompt " * 20
    with ServerThread(engine, served) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)

        def cached() -> int:
            r = client.completions.create(model="llama-3-8b", prompt=prompt, max_tokens=2)
            details = r.usage.prompt_tokens_details if r.usage else None
            return details.cached_tokens if details and details.cached_tokens else 0

        assert cached() == 0 and cached() > 0
        with InnocentStream(s, max_tokens=60):
            status, data, _ = call(s, "/reset_prefix_cache", b"")
            assert_openai_error(status, data, 409)
            assert "idle" in data["error"]["message"]
        assert cached() > 0  # the refused reset dropped nothing
        assert call(s, "/reset_prefix_cache", b"")[:2] == (200, {"reset": True})
        assert cached() == 0
        assert reset_prefix_cache(s.url) == "/reset_prefix_cache"
    with ServerThread(*simulated_model(SIM_CONFIG, gpu="h100"), api_key="k") as s:
        status, data, _ = call(s, "/reset_prefix_cache", b"")
        assert_openai_error(status, data, 401)  # a server with a key wants it here too
        key = {"Authorization": "Bearer k"}
        assert call(s, "/reset_prefix_cache", b"", headers=key)[0] == 200


def test_the_reset_client_finds_sglangs_endpoint_and_says_when_there_is_none() -> None:
    from slotune.workloads.server_process import reset_prefix_cache

    flushed: list[str] = []

    async def flush(request: web.Request) -> web.Response:
        flushed.append(request.method)
        return web.Response(text="Cache flushed.")

    sglang_like = web.Application()
    sglang_like.router.add_post("/flush_cache", flush)
    with AppThread(sglang_like) as s:
        assert reset_prefix_cache(s.url) == "/flush_cache" and flushed == ["POST"]
    with AppThread(web.Application()) as s:  # vLLM outside its development mode
        assert reset_prefix_cache(s.url) is None
    assert reset_prefix_cache(f"http://127.0.0.1:{free_port()}") is None
