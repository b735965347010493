"""The server over a simulated GPU: clients see the simulated step durations."""

from __future__ import annotations

import time

import openai

from slotune.engine import Engine, SamplingParams
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
