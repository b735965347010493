"""The server over a simulated GPU: clients see the simulated step durations."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any

import openai
import pytest

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.server import app as server_app
from slotune.server import simulated_model
from slotune.server.async_engine import AsyncEngine
from slotune.workloads.tokenizer import family_tokenizer
from tests.server.conftest import SIM_CONFIG, ServerThread
from tests.server.helpers import call


def _simulated_seconds(prompt_ids: list[int], max_tokens: int) -> float:
    """The sum of step durations of the same request on an in-process simulated engine."""
    engine = Engine.simulated(SIM_CONFIG, gpu="h100", model="llama-3-8b")
    engine.add_request("ref", prompt_ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    total = 0.0
    while engine.has_unfinished_requests():
        engine.step()
        assert engine.last_step is not None
        total += engine.last_step.duration_s
    return total


def test_responses_are_paced_by_the_simulated_step_durations(sim_server: ServerThread) -> None:
    prompt = "hello " * 600  # 601 Llama-3 tokens and BOS: three prefill chunks of 256
    ids = family_tokenizer("llama-3-8b").encode(prompt)
    client = openai.OpenAI(base_url=sim_server.url + "/v1", api_key="none", max_retries=0)
    expected = _simulated_seconds(ids, 40)
    assert expected > 0.2  # long enough that pacing, not overhead, dominates
    start = time.perf_counter()
    stream = client.completions.create(
        model="llama-3-8b",
        prompt=prompt,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    arrivals, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter() - start)
        usage = chunk.usage or usage
    elapsed = time.perf_counter() - start
    assert usage is not None and usage.completion_tokens == 40 and usage.prompt_tokens == len(ids)
    assert len(arrivals) == 40  # one visible character per simulated token
    assert arrivals[0] >= _simulated_seconds(ids, 1)  # prefill
    assert arrivals[-1] >= expected
    assert elapsed >= expected


def _first_token_s(client: openai.OpenAI, prompt: str) -> float:
    start = time.perf_counter()
    body = {"ignore_eos": True}
    stream = client.completions.create(
        model="llama-3-8b", prompt=prompt, max_tokens=2, stream=True, extra_body=body
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - start
    assert first is not None
    return first


def test_the_stacks_request_latency_covers_the_servers_own_handling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulated stack's per-request latency (HTTP, tokenizer) counts from the request's
    arrival, and the first step is paced from where it ends: this server's own parsing,
    made 0.3 s slower, runs inside that latency (0.4 s) instead of adding to it. Compared
    with a request parsed at the usual speed on the same server and connection, so that
    what else the machine does cancels out."""
    parse = server_app.parse_request
    slow = threading.Event()

    def parse_request(*args: Any, **kwargs: Any) -> Any:
        if slow.is_set():
            time.sleep(0.3)
        return parse(*args, **kwargs)

    monkeypatch.setattr(server_app, "parse_request", parse_request)
    engine, served = simulated_model(SIM_CONFIG, gpu="h100", model="llama-3-8b")
    prompts = [f"{word} " * 20 for word in ("warm", "hello", "world")]
    tokenizer = family_tokenizer("llama-3-8b")
    prefill = [_simulated_seconds(tokenizer.encode(p), 1) for p in prompts]
    with ServerThread(engine, replace(served, request_delay_s=0.4)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        _first_token_s(client, prompts[0])  # the connection and every first use
        usual = _first_token_s(client, prompts[1])
        slow.set()
        slowed = _first_token_s(client, prompts[2])
    assert usual >= 0.4 + prefill[1] and slowed >= 0.4 + prefill[2]
    # added up, the slow parse would come 0.3 s later
    assert slowed - usual < 0.15


def test_a_paced_step_begins_when_its_requests_entered() -> None:
    """A request handed in with an earlier ``entered_at`` (its handler's arrival plus the
    stack's latency) has its first step paced from then: the server's own delay between
    the two is not added to the step's duration (a 0.28 s prefill here)."""
    config = EngineConfig(max_num_batched_tokens=8192, max_model_len=8192)
    prompt, params = [5] * 8000, SamplingParams(max_tokens=1, ignore_eos=True)
    reference = Engine.simulated(config, gpu="h100", model="llama-3-8b")
    reference.add_request("a", prompt, params)
    reference.step()
    assert reference.last_step is not None
    prefill = reference.last_step.duration_s

    async def first_output_s(entered_before_s: float | None) -> float:
        engine = AsyncEngine(Engine.simulated(config, gpu="h100", model="llama-3-8b"), pace=True)
        engine.start()
        loop = asyncio.get_running_loop()
        start = loop.time()
        entered = None if entered_before_s is None else start - entered_before_s
        outputs: asyncio.Queue[Any] = asyncio.Queue()
        await engine.submit("a", prompt, params, outputs, entered_at=entered)
        await outputs.get()
        elapsed = loop.time() - start
        await engine.stop()
        return elapsed

    assert prefill > 0.2
    assert asyncio.run(first_output_s(None)) >= prefill
    assert asyncio.run(first_output_s(prefill)) < prefill / 2


def test_simulated_server_counts_virtual_time(sim_server: ServerThread) -> None:
    engine = sim_server.async_engine
    before = engine.virtual_time_s
    client = openai.OpenAI(base_url=sim_server.url + "/v1", api_key="none", max_retries=0)
    start = time.perf_counter()
    r = client.chat.completions.create(
        model="llama-3-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    elapsed = time.perf_counter() - start
    assert r.usage is not None and r.usage.completion_tokens == 5
    assert len(r.choices[0].message.content or "") == 5
    assert elapsed >= engine.virtual_time_s - before > 0


def test_tokenize_counts_the_model_familys_tokens(sim_server: ServerThread) -> None:
    """As vLLM serving Llama-3-8B answers: its BPE ids with BOS (not one id per byte)."""
    text = "The quick brown fox jumps over the lazy dog."
    status, data, _ = call(sim_server, "/tokenize", {"model": "llama-3-8b", "prompt": text})
    assert status == 200, data
    reference = family_tokenizer("llama-3-8b")
    assert reference.encoding == "llama3"
    assert data["tokens"] == reference.encode(text)
    assert data["tokens"][:3] == [128000, 791, 4062]  # <|begin_of_text|> "The" " quick"
    assert data["count"] == len(text.split()) + 2  # a token a word, the period, BOS
    plain = {"prompt": text, "add_special_tokens": False}
    assert call(sim_server, "/tokenize", plain)[1]["tokens"] == data["tokens"][1:]
