"""The server over a real tiny checkpoint, through the official openai client."""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from slotune.engine import Engine, SamplingParams
from slotune.server.text import render_chat
from slotune.workloads import ArrivalSpec, Trace, TraceRequest, run_http, summarize
from tests.server.conftest import CONFIG, ServerThread
from tests.server.helpers import post

PROMPTS = ["The quick brown fox", "Once upon a time", "In a hole in the ground", "Hello"]


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> Any:
    """Greedy text of the in-process engine: ``reference(prompt_ids, max_tokens)``."""
    engine = Engine.local(CONFIG, model=str(tiny_dir))
    tok = engine.executor.tokenizer  # type: ignore[attr-defined]
    counter = iter(range(1 << 30))

    def generate(prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False) -> str:
        rid = f"ref{next(counter)}"
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
        engine.add_request(rid, prompt_ids, params)
        ids: list[int] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                ids += out.new_token_ids
        return tok.decode(ids, skip_special_tokens=True)

    generate.encode = lambda text: tok.encode(text).ids  # type: ignore[attr-defined]
    return generate


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_models_and_health(server: ServerThread, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]
    with urllib.request.urlopen(server.url + "/health", timeout=10) as resp:
        assert resp.status == 200


def test_completion_is_the_in_process_engines_greedy_text(
    client: openai.OpenAI, reference: Any
) -> None:
    for prompt in PROMPTS:
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        assert r.choices[0].text == reference(reference.encode(prompt), 12)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert r.usage is not None and r.usage.prompt_tokens == len(reference.encode(prompt))


def test_token_id_prompt_and_ignore_eos(client: openai.OpenAI, reference: Any) -> None:
    ids = reference.encode(PROMPTS[0])
    r = client.completions.create(
        model="tiny", prompt=ids, max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].text == reference(ids, 20, ignore_eos=True)
    assert r.usage is not None and r.usage.completion_tokens == 20
    assert r.choices[0].finish_reason == "length"


def test_streamed_completion_joins_to_the_same_text(client: openai.OpenAI, reference: Any) -> None:
    stream = client.completions.create(
        model="tiny",
        prompt=PROMPTS[1],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == reference(reference.encode(PROMPTS[1]), 16, ignore_eos=True)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 16
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_uses_the_role_lines_template(
    client: openai.OpenAI, reference: Any, stream: bool
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me a story"},
    ]
    expected = reference(reference.encode(render_chat(messages, None, {})), 10, ignore_eos=True)
    kwargs: dict[str, Any] = dict(
        model="tiny",
        messages=messages,
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "length"
    else:
        r = client.chat.completions.create(**kwargs)
        text = r.choices[0].message.content or ""
        assert r.choices[0].message.role == "assistant"
        assert r.usage is not None and r.usage.completion_tokens == 10
    assert text == expected


def test_n_2_gives_two_choices(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="tiny",
        prompt=PROMPTS[2],
        max_tokens=8,
        n=2,
        temperature=1.0,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage is not None and r.usage.completion_tokens == 16
    assert all(c.finish_reason == "length" for c in r.choices)
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPTS[2],
            max_tokens=8,
            n=2,
            temperature=1.0,
            seed=3,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    streamed = [
        "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in (0, 1)
    ]
    assert streamed == [c.text for c in sorted(r.choices, key=lambda c: c.index)]


def test_logprobs_of_sampled_tokens(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=6,
        temperature=0,
        logprobs=0,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None
    assert len(lp.token_logprobs) == 6
    assert all(x is not None and x <= 0 and math.isfinite(x) for x in lp.token_logprobs)
    c = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )
    content = c.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4 and all(e.logprob <= 0 for e in content)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": "tiny", "max_tokens": 4}, "prompt"),
        ("/v1/completions", {"prompt": 7}, "prompt"),
        ("/v1/completions", {"prompt": ["a", 3]}, "prompt"),
        ("/v1/completions", {"prompt": [1, -2]}, "prompt"),
        ("/v1/completions", {"prompt": [1, 10**6]}, "prompt"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "8"}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "temperature"),
        ("/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature"),
        ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
        ("/v1/completions", {"prompt": "hi", "n": 0}, "n"),
        ("/v1/completions", {"prompt": "hi", "n": 99}, "n"),
        ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream"),
        ("/v1/completions", {"prompt": "hi", "stop_token_ids": ["x"]}, "stop_token_ids"),
        ("/v1/completions", {"prompt": "hi", "stop": [3]}, "stop"),
        ("/v1/completions", {"prompt": list(range(2000))[:1025]}, "prompt"),
        ("/v1/chat/completions", {"model": "tiny"}, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages"),
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", [1, 2], None),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    server: ServerThread, path: str, body: Any, param: str | None
) -> None:
    status, data = post(server, path, body)
    assert status == 400, data
    assert data["error"]["type"] == "invalid_request_error"
    assert data["error"]["param"] == param
    assert data["error"]["message"]


def test_prompt_longer_than_max_model_len_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=[5] * (CONFIG.max_model_len + 1))
    assert "max_model_len" in str(info.value)


def _wait(server: ServerThread, cond: Any, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.call(cond):
            return True
        time.sleep(0.02)
    return False


def test_a_client_that_disconnects_aborts_its_request(
    server: ServerThread, client: openai.OpenAI
) -> None:
    engine = server.async_engine
    before = engine.num_aborted
    stream = client.completions.create(
        model="tiny",
        prompt=PROMPTS[0],
        max_tokens=1000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _, _chunk in zip(range(3), stream, strict=False):
        pass
    stream.close()
    assert _wait(server, lambda: engine.num_aborted == before + 1)
    assert _wait(server, lambda: not engine.engine.has_unfinished_requests())


def test_non_streamed_client_that_leaves_aborts_too(server: ServerThread) -> None:
    engine = server.async_engine
    before = engine.num_aborted
    body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True}
    req = urllib.request.Request(
        server.url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(TimeoutError):
        urllib.request.urlopen(req, timeout=0.2)
    assert _wait(server, lambda: engine.num_aborted == before + 1)
    assert _wait(server, lambda: not engine.engine.has_unfinished_requests())


def test_concurrent_streams_all_finish_in_order(server: ServerThread, reference: Any) -> None:
    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, int]:
        stream = await client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, tokens = "", 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return text, tokens

    async def main() -> list[tuple[str, int]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        try:
            return await asyncio.gather(*(one(client, p) for p in PROMPTS * 2))
        finally:
            await client.close()

    results = asyncio.run(main())
    for prompt, (text, tokens) in zip(PROMPTS * 2, results, strict=True):
        assert tokens == 24
        assert text == reference(reference.encode(prompt), 24, ignore_eos=True)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_run_http_against_the_server(server: ServerThread, endpoint: str) -> None:
    texts = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota", "kappa", "lambda mu"]
    trace = Trace(
        name="server",
        requests=tuple(
            TraceRequest(
                request_id=f"r{i}",
                prompt_len=len(t),
                output_len=6 + i,
                prompt_token_ids=tuple(t.encode()),
                prompt_text=t,
            )
            for i, t in enumerate(texts)
        ),
    )
    result = run_http(
        server.url,
        trace,
        ArrivalSpec(rate=50, constant=True),
        model="tiny",
        endpoint=endpoint,
        timeout_s=60,
    )
    df = result.requests
    assert df["error"].isna().all(), df["error"].tolist()
    assert df["output_tokens"].tolist() == [6 + i for i in range(len(texts))]
    summary = summarize(result)
    assert summary["completed"] == len(texts) and summary["failed"] == 0
    for key in ("ttft_ms", "tpot_ms"):
        assert math.isfinite(summary[key]["mean"]) and summary[key]["mean"] > 0
