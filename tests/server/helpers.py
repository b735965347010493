"""Plain HTTP calls and an innocent stream that runs while a test does something hostile."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import ServerThread


def call(
    server: ServerThread,
    path: str,
    body: Any = None,
    *,
    method: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
) -> tuple[int, Any, dict[str, str]]:
    """Status, decoded body (JSON when it parses, else text) and headers."""
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, hdrs = resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        status, raw, hdrs = exc.code, exc.read(), dict(exc.headers)
    try:
        return status, json.loads(raw), hdrs
    except ValueError:
        return status, raw.decode(), hdrs


def post(server: ServerThread, path: str, body: Any) -> tuple[int, Any]:
    status, data, _ = call(server, path, body)
    return status, data


def scrape(server: ServerThread) -> dict[str, float]:
    """Every sample as ``name{label=value,...}`` (labels sorted, model_name left out)."""
    status, text, headers = call(server, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def assert_openai_error(status: int, data: Any, expected: int) -> None:
    assert status == expected, data
    assert isinstance(data, dict) and set(data) == {"error"}, data
    error = data["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    kind = "server_error" if expected >= 500 else "invalid_request_error"
    assert error["type"] == kind


class InnocentStream:
    """A streamed completion that is running (its first token received) inside the ``with``
    block and must come out whole: ``max_tokens`` chunks and tokens, finish "length"."""

    def __init__(self, server: ServerThread, max_tokens: int = 300, prompt: str = "Once") -> None:
        self.client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        self.model = server.served.name
        self.max_tokens = max_tokens
        self.prompt = prompt

    def __enter__(self) -> InnocentStream:
        self.stream = self.client.completions.create(
            model=self.model,
            prompt=self.prompt,
            max_tokens=self.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        self._chunks = iter(self.stream)
        self.first = next(self._chunks)
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.stream.close()
            return
        chunks = [self.first, *self._chunks]
        token_chunks = [c for c in chunks if c.choices]
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == self.max_tokens
        assert len(token_chunks) == self.max_tokens  # one chunk per token
        assert token_chunks[-1].choices[0].finish_reason == "length"
