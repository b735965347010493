"""``/metrics`` read back with prometheus_client's parser after a load with disconnects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from slotune.engine import Engine, SamplingParams
from slotune.server import simulated_model
from slotune.workloads.tokenizer import family_tokenizer
from tests.server.conftest import SIM_CONFIG, ServerThread
from tests.server.helpers import call, scrape
from tests.server.load import run_load

CLIENTS, MAX_TOKENS, LEAVE_AFTER = 30, 12, 3


@pytest.fixture
def fresh_sim_server() -> Iterator[ServerThread]:
    engine, served = simulated_model(SIM_CONFIG, gpu="h100", model="llama-3-8b")
    with ServerThread(engine, served) as s:
        yield s


def _idle(server: ServerThread) -> None:
    deadline = time.monotonic() + 20
    engine = server.async_engine
    while time.monotonic() < deadline:
        if server.call(lambda: engine.num_requests == 0 and not engine.engine.scheduler.requests):
            return
        time.sleep(0.05)
    raise AssertionError("requests left running after the load")


@pytest.mark.parametrize("which", ["server", "fresh_sim_server"])
def test_metrics_after_a_load_with_disconnects(request: pytest.FixtureRequest, which: str) -> None:
    server: ServerThread = request.getfixturevalue(which)
    before = scrape(server)
    prompt = "The same words to start every prompt, so that the prefix cache hits. " * 2
    load = asyncio.run(
        run_load(
            server.url,
            server.served.name,
            clients=CLIENTS,
            max_tokens=MAX_TOKENS,
            prompt=prompt,
            leave_after=LEAVE_AFTER,
            timeout_s=60,
        )
    )
    assert load.errors == []
    assert load.completed == 20 and load.left == 10
    _idle(server)
    after = scrape(server)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert after[f"vllm:{gauge}"] == 0, gauge
    assert grew("vllm:time_to_first_token_seconds_count") == CLIENTS
    assert grew("vllm:request_queue_time_seconds_count") == CLIENTS
    assert grew("vllm:e2e_request_latency_seconds_count") == load.completed
    assert grew("vllm:request_success_total{finished_reason=length}") == load.completed
    assert grew("vllm:request_success_total{finished_reason=abort}") == load.left
    completed_tokens = load.completed * MAX_TOKENS
    assert grew("vllm:generation_tokens_total") >= completed_tokens + load.left * LEAVE_AFTER
    # every token after a request's first, up to those of the clients that left
    itl = grew("vllm:inter_token_latency_seconds_count")
    assert itl >= load.completed * (MAX_TOKENS - 1) + load.left * (LEAVE_AFTER - 1)
    assert itl == grew("vllm:generation_tokens_total") - CLIENTS
    prompt_len = len(server.served.tokenizer.encode(prompt))
    assert grew("vllm:prompt_tokens_total") == CLIENTS * prompt_len
    assert 0 < grew("vllm:prefix_cache_hits_total") <= grew("vllm:prefix_cache_queries_total")
    assert grew("vllm:num_preemptions_total") >= 0
    assert (
        after["vllm:time_to_first_token_seconds_bucket{le=+Inf}"]
        == after["vllm:time_to_first_token_seconds_count"]
    )


def test_simulated_histograms_hold_simulated_times(fresh_sim_server: ServerThread) -> None:
    """One request alone: its TTFT and e2e latency are the simulated step durations of an
    in-process engine running the same request, to the last bit of rounding."""
    prompt = "hello " * 600
    engine = Engine.simulated(SIM_CONFIG, gpu="h100", model="llama-3-8b")
    ids = family_tokenizer("llama-3-8b").encode(prompt)
    engine.add_request("ref", ids, SamplingParams(max_tokens=8, ignore_eos=True))
    clock, ttft = 0.0, None
    while engine.has_unfinished_requests():
        outputs = engine.step()
        clock += engine.last_step.duration_s  # type: ignore[union-attr]
        if ttft is None and any(o.new_token_ids for o in outputs):
            ttft = clock
    body = {"model": "llama-3-8b", "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
    assert call(fresh_sim_server, "/v1/completions", body)[0] == 200
    _idle(fresh_sim_server)
    after = scrape(fresh_sim_server)
    assert after["vllm:e2e_request_latency_seconds_count"] == 1
    assert after["vllm:time_to_first_token_seconds_sum"] == pytest.approx(ttft, rel=1e-9)
    assert after["vllm:e2e_request_latency_seconds_sum"] == pytest.approx(clock, rel=1e-9)
    assert after["vllm:request_queue_time_seconds_sum"] == 0
