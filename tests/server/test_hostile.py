"""Hostile and malformed requests: each is answered with its 4xx as an OpenAI error object,
by the real tiny model's server and by the simulated one alike, and neither is hurt."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.server.conftest import ServerThread
from tests.server.helpers import InnocentStream, assert_openai_error, call

C, CHAT = "/v1/completions", "/v1/chat/completions"
HI = {"prompt": "hi"}
USER = {"messages": [{"role": "user", "content": "hi"}]}

Body = Any  # a dict, raw bytes, or a function of the server's ServedModel

CASES: list[tuple[str, str, str, Body, int, str | None]] = [
    # (name, method, path, body, status, param)
    ("no prompt", "POST", C, {"max_tokens": 4}, 400, "prompt"),
    ("prompt a number", "POST", C, {"prompt": 7}, 400, "prompt"),
    ("batch with a number", "POST", C, {"prompt": ["a", 5]}, 400, "prompt"),
    ("batch with an empty prompt", "POST", C, {"prompt": ["a", []]}, 400, "prompt"),
    ("empty prompt list", "POST", C, {"prompt": []}, 400, "prompt"),
    ("negative token", "POST", C, {"prompt": [1, -2]}, 400, "prompt"),
    ("token past vocab", "POST", C, {"prompt": [1, 10**7]}, 400, "prompt"),
    ("token past int64", "POST", C, {"prompt": [1, 2**70]}, 400, "prompt"),
    ("float token", "POST", C, {"prompt": [1.5]}, 400, "prompt"),
    ("bool token", "POST", C, {"prompt": [True]}, 400, "prompt"),
    (
        "prompt fills the context",
        "POST",
        C,
        lambda s: {"prompt": [5] * s.max_model_len},
        400,
        "prompt",
    ),
    ("max_tokens 0", "POST", C, HI | {"max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens string", "POST", C, HI | {"max_tokens": "8"}, 400, "max_tokens"),
    ("max_tokens negative", "POST", C, HI | {"max_tokens": -5}, 400, "max_tokens"),
    ("max_tokens huge", "POST", C, HI | {"max_tokens": 10**30}, 400, "max_tokens"),
    ("max_tokens float", "POST", C, HI | {"max_tokens": 2.5}, 400, "max_tokens"),
    ("temperature string", "POST", C, HI | {"temperature": "hot"}, 400, "temperature"),
    ("temperature negative", "POST", C, HI | {"temperature": -1}, 400, "temperature"),
    ("temperature NaN", "POST", C, b'{"prompt": "hi", "temperature": NaN}', 400, "temperature"),
    (
        "temperature inf",
        "POST",
        C,
        b'{"prompt": "hi", "temperature": Infinity}',
        400,
        "temperature",
    ),
    ("temperature 1e999", "POST", C, b'{"prompt": "hi", "temperature": 1e999}', 400, "temperature"),
    ("top_p 0", "POST", C, HI | {"top_p": 0}, 400, "top_p"),
    ("top_p 1.5", "POST", C, HI | {"top_p": 1.5}, 400, "top_p"),
    ("top_k -2", "POST", C, HI | {"top_k": -2}, 400, "top_k"),
    ("top_k string", "POST", C, HI | {"top_k": "x"}, 400, "top_k"),
    ("n 0", "POST", C, HI | {"n": 0}, 400, "n"),
    ("n 99", "POST", C, HI | {"n": 99}, 400, "n"),
    ("seed 2**64", "POST", C, HI | {"seed": 2**64}, 400, "seed"),
    ("seed string", "POST", C, HI | {"seed": "1"}, 400, "seed"),
    ("stream string", "POST", C, HI | {"stream": "yes"}, 400, "stream"),
    ("stop_token_ids strings", "POST", C, HI | {"stop_token_ids": ["x"]}, 400, "stop_token_ids"),
    ("stop_token_ids negative", "POST", C, HI | {"stop_token_ids": [-1]}, 400, "stop_token_ids"),
    ("stop_token_ids not a list", "POST", C, HI | {"stop_token_ids": 5}, 400, "stop_token_ids"),
    ("ignore_eos string", "POST", C, HI | {"ignore_eos": "no"}, 400, "ignore_eos"),
    ("stream_options string", "POST", C, HI | {"stream_options": "x"}, 400, "stream_options"),
    ("stop a number", "POST", C, HI | {"stop": 5}, 400, "stop"),
    ("stop list of numbers", "POST", C, HI | {"stop": [1, 2]}, 400, "stop"),
    ("echo with logprobs", "POST", C, HI | {"echo": True, "logprobs": 0}, 400, "echo"),
    ("echo a string", "POST", C, HI | {"echo": "yes"}, 400, "echo"),
    ("echo in chat", "POST", CHAT, USER | {"echo": True}, 400, "echo"),
    ("best_of", "POST", C, HI | {"best_of": 3}, 400, "best_of"),
    ("presence_penalty", "POST", C, HI | {"presence_penalty": 0.5}, 400, "presence_penalty"),
    ("frequency_penalty", "POST", C, HI | {"frequency_penalty": 1}, 400, "frequency_penalty"),
    ("repetition_penalty", "POST", C, HI | {"repetition_penalty": 1.2}, 400, "repetition_penalty"),
    ("logit_bias", "POST", C, HI | {"logit_bias": {"5": 1}}, 400, "logit_bias"),
    ("logprobs past 20", "POST", C, HI | {"logprobs": 21}, 400, "logprobs"),
    ("logprobs negative", "POST", C, HI | {"logprobs": -1}, 400, "logprobs"),
    ("logprobs a float", "POST", C, HI | {"logprobs": 2.0}, 400, "logprobs"),
    ("suffix", "POST", C, HI | {"suffix": "end"}, 400, "suffix"),
    ("min_p", "POST", C, HI | {"min_p": 0.1}, 400, "min_p"),
    ("allowed_token_ids", "POST", C, HI | {"allowed_token_ids": [5]}, 400, "allowed_token_ids"),
    (
        "keep special tokens",
        "POST",
        C,
        HI | {"skip_special_tokens": False},
        400,
        "skip_special_tokens",
    ),
    ("chat_template", "POST", CHAT, USER | {"chat_template": "{{ x }}"}, 400, "chat_template"),
    (
        "continue_final_message",
        "POST",
        CHAT,
        USER | {"continue_final_message": True},
        400,
        "continue_final_message",
    ),
    ("unknown model", "POST", C, HI | {"model": "gpt-4"}, 404, "model"),
    ("not JSON", "POST", C, b"{not json", 400, None),
    ("JSON list", "POST", C, b"[1, 2]", 400, None),
    ("JSON string", "POST", C, b'"hi"', 400, None),
    ("empty body", "POST", C, b"", 400, None),
    ("invalid UTF-8", "POST", C, b'{"prompt": "\xff\xfe"}', 400, None),
    ("nested 100k deep", "POST", C, b"[" * 100_000 + b"]" * 100_000, 400, None),
    ("5000-digit integer", "POST", C, b'{"prompt": "hi", "n": ' + b"7" * 5000 + b"}", 400, None),
    ("lone surrogate", "POST", C, b'{"prompt": "\\ud800"}', 400, "prompt"),
    ("no messages", "POST", CHAT, {"max_tokens": 3}, 400, "messages"),
    ("empty messages", "POST", CHAT, {"messages": []}, 400, "messages"),
    ("message without role", "POST", CHAT, {"messages": [{"content": "x"}]}, 400, "messages"),
    (
        "content a number",
        "POST",
        CHAT,
        {"messages": [{"role": "user", "content": 5}]},
        400,
        "messages",
    ),
    (
        "image content",
        "POST",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        "messages",
    ),
    (
        "surrogate in a message",
        "POST",
        CHAT,
        b'{"messages": [{"role": "user", "content": "\\udc00"}]}',
        400,
        "messages",
    ),
    ("tools", "POST", CHAT, USER | {"tools": [{"type": "function"}]}, 400, "tools"),
    (
        "response_format",
        "POST",
        CHAT,
        USER | {"response_format": {"type": "json_object"}},
        400,
        "response_format",
    ),
    (
        "top_logprobs past 20",
        "POST",
        CHAT,
        USER | {"logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
    ),
    ("top_logprobs alone", "POST", CHAT, USER | {"top_logprobs": 2}, 400, "top_logprobs"),
    ("logprobs string", "POST", CHAT, USER | {"logprobs": "yes"}, 400, "logprobs"),
    (
        "max_completion_tokens 0",
        "POST",
        CHAT,
        USER | {"max_completion_tokens": 0},
        400,
        "max_completion_tokens",
    ),
    ("chat unknown model", "POST", CHAT, USER | {"model": "gpt-4"}, 404, "model"),
    ("GET on completions", "GET", C, None, 405, None),
    ("unknown /v1 path", "POST", "/v1/nothing", HI, 404, None),
    ("unknown path", "GET", "/nope", None, 404, None),
    ("unknown model card", "GET", "/v1/models/gpt-4", None, 404, "model"),
    ("tokenize without prompt", "POST", "/tokenize", {"model": None}, 400, "prompt"),
    ("tokenize surrogate", "POST", "/tokenize", b'{"prompt": "\\ud800"}', 400, "prompt"),
    ("detokenize negative", "POST", "/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("detokenize not a list", "POST", "/detokenize", {"tokens": "x"}, 400, "tokens"),
]


@pytest.fixture(params=["server", "sim_server"])
def any_server(request: pytest.FixtureRequest) -> ServerThread:
    return request.getfixturevalue(request.param)


def test_there_are_at_least_forty_cases() -> None:
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_hostile_request_is_an_openai_error(
    any_server: ServerThread,
    method: str,
    path: str,
    body: Body,
    status: int,
    param: str | None,
) -> None:
    if isinstance(body, Callable):  # type: ignore[arg-type]
        body = body(any_server.served)
    code, data, _ = call(any_server, path, body, method=method)
    assert_openai_error(code, data, status)
    assert data["error"]["param"] == param, data


def test_server_is_healthy_after_the_hostile_requests(any_server: ServerThread) -> None:
    with InnocentStream(any_server, max_tokens=20):
        assert call(any_server, "/health")[0] == 200
    assert any_server.async_engine.num_step_errors == 0
