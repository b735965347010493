"""Issue 13's faults: no request, however hostile, fails or stalls another one in flight."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import openai
import pytest
import torch

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine.model.sampler import Sampler, SampleRow
from slotune.engine.outputs import RequestOutput
from slotune.server import simulated_model
from slotune.server.protocol import GenerationRequest
from slotune.server.responses import Completion
from slotune.server.text import CheckpointTokenizer
from slotune.workloads.tokenizer import family_tokenizer
from tests.server.conftest import SIM_CONFIG, ServerThread
from tests.server.helpers import InnocentStream, assert_openai_error, call, post


def _completion(server: ServerThread, **fields: object) -> tuple[int, dict]:
    body = {"model": server.served.name, "prompt": "Hello", "max_tokens": 4, **fields}
    return post(server, "/v1/completions", body)


# -- 1: temperatures that underflow float32, seeds outside int64 -----------------------------


def test_sampler_takes_underflowing_temperatures_as_greedy_and_any_seed() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    rows = [
        SampleRow("a", SamplingParams(temperature=1e-46), 1),
        SampleRow("b", SamplingParams(temperature=1e-46, seed=5), 2),
        SampleRow("c", SamplingParams(seed=2**64 - 1, n=2), 1, index=1),
    ]
    out = Sampler().sample(logits, rows)
    best = logits.argmax(dim=-1).tolist()
    assert out[0].token_ids == [best[0]] and out[1].token_ids == [best[1], best[1]]
    assert 0 <= out[2].token_ids[0] < 50


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"temperature": 1e-46}, 200),
        ({"temperature": 5e-324, "seed": 1}, 200),
        ({"seed": 2**63 - 1, "n": 2, "temperature": 1.0}, 200),
        ({"seed": -(2**63), "temperature": 1.0}, 200),
        ({"seed": 2**64}, 400),
        ({"seed": 2**64 - 1, "n": 2}, 400),
        ({"seed": -(2**63) - 1}, 400),
    ],
)
def test_extreme_temperatures_and_seeds_fail_no_other_request(
    server: ServerThread, fields: dict, status: int
) -> None:
    with InnocentStream(server):
        code, data = _completion(server, **fields)
    if status == 200:
        assert code == 200, data
        assert all(c["finish_reason"] in ("stop", "length") for c in data["choices"])
    else:
        assert_openai_error(code, data, 400)
        assert data["error"]["param"] == "seed"
    assert server.async_engine.num_step_errors == 0


def test_tiny_temperature_is_greedy(server: ServerThread) -> None:
    runs = [_completion(server, temperature=t, max_tokens=12, ignore_eos=True) for t in (0, 1e-9)]
    assert runs[0][1]["choices"][0]["text"] == runs[1][1]["choices"][0]["text"]


# -- 2: stop tokens that cover every token the simulator draws ------------------------------


def test_sim_executor_stops_when_stop_tokens_cover_its_range() -> None:
    engine = Engine.simulated(EngineConfig(max_model_len=256), gpu="h100")
    stops = tuple(range(32000))  # every token the simulator draws (100..31999) and more

    def run() -> None:
        engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=50, stop_token_ids=stops))
        while engine.has_unfinished_requests():
            engine.step()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "the simulated token draw loops forever"


def test_stop_tokens_covering_the_sim_range_stall_no_stream(sim_server: ServerThread) -> None:
    body = {
        "model": "llama-3-8b",
        "prompt": "hi",
        "max_tokens": 20,
        "stop_token_ids": list(range(100, 32000)),  # a ~190 KB request
    }
    assert len(json.dumps(body)) > 150_000
    start = time.monotonic()
    with InnocentStream(sim_server, max_tokens=100):
        status, data, _ = call(sim_server, "/v1/completions", body, timeout=20)
    assert time.monotonic() - start < 20
    assert status == 200, data
    assert data["choices"][0]["finish_reason"] == "stop"  # its first token stops it
    assert data["usage"]["completion_tokens"] == 1
    assert call(sim_server, "/health", timeout=5)[0] == 200


# -- 3: chat TTFT is the first token's time -----------------------------------------------------


def test_chat_first_chunk_comes_with_the_first_token() -> None:
    """The prefill of 1,500 prompt tokens takes half a simulated second on an L4; the first
    chunk a client sees (the role) must not come before it, and the first token follows."""
    prompt = "why " * 1500
    engine = Engine.simulated(SIM_CONFIG, gpu="l4", model="llama-3-8b")
    ids = family_tokenizer("llama-3-8b").encode("user: " + prompt + "\nassistant:")
    assert len(ids) > 1500
    engine.add_request("ref", ids, SamplingParams(max_tokens=2, ignore_eos=True))
    ttft = 0.0
    while not any(out.new_token_ids for out in engine.step()):
        ttft += engine.last_step.duration_s  # type: ignore[union-attr]
    ttft += engine.last_step.duration_s  # type: ignore[union-attr]
    assert ttft > 0.3
    with ServerThread(*simulated_model(SIM_CONFIG, gpu="l4", model="llama-3-8b")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        start = time.perf_counter()
        stream = client.chat.completions.create(
            model="llama-3-8b",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=2,
            stream=True,
        )
        arrivals = [(time.perf_counter() - start, chunk) for chunk in stream]
    assert arrivals[0][1].choices[0].delta.role == "assistant"
    assert arrivals[1][1].choices[0].delta.content  # the first token follows the role
    assert arrivals[0][0] >= ttft
    assert len(arrivals) == 3  # the role chunk and one chunk per token


# -- 4: tokenization does not block the event loop ----------------------------------------------


def test_a_huge_prompt_is_refused_without_stalling_streams(server: ServerThread) -> None:
    prompt = "word " * 2_000_000  # 10 MB
    with InnocentStream(server):
        start = time.monotonic()
        status, data = post(server, "/v1/completions", {"model": "tiny", "prompt": prompt})
        elapsed = time.monotonic() - start
        health_status = call(server, "/health", timeout=5)[0]
    assert_openai_error(status, data, 400)
    assert data["error"]["param"] == "prompt"
    assert data["error"]["code"] == "context_length_exceeded"
    assert elapsed < 15  # it took 32 s to tokenize on the event loop
    assert health_status == 200


def test_a_prompt_near_the_limit_is_tokenized_off_the_loop(server: ServerThread) -> None:
    limit_chars = server.served.max_model_len * server.served.max_token_chars
    prompt = "ab " * (limit_chars // 3)  # within the character bound, too many tokens
    with InnocentStream(server):
        status, data = post(server, "/v1/completions", {"model": "tiny", "prompt": prompt})
    assert_openai_error(status, data, 400)
    assert data["error"]["code"] == "context_length_exceeded"


@pytest.mark.slow
def test_long_texts_are_tokenized_without_holding_the_gil(tiny_dir: Path) -> None:
    """A worker thread that tokenizes must let the event loop's thread run meanwhile."""
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    tok = CheckpointTokenizer(reference)
    text = "hello world naive " * 80_000  # 1.4 MB: over a second to tokenize here
    gaps: list[float] = []
    done = threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    start = time.perf_counter()
    ids = tok.encode(text)
    took = time.perf_counter() - start
    done.set()
    ticker.join()
    assert ids == reference.encode(text).ids
    assert tok.decode(ids) == reference.decode(ids, skip_special_tokens=True)
    assert max(gaps) < max(0.5, took / 2), (max(gaps), took)


# -- 5: bodies that used to be answered with a 500 ----------------------------------------------


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"[" * 200_000 + b"]" * 200_000, None),
        (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", None),
        (b'{"prompt": "a\\ud800b"}', "prompt"),
        (b'{"prompt": ["\\udfff"]}', "prompt"),
    ],
)
def test_malformed_bodies_are_400s_not_500s(server: ServerThread, raw: bytes, param: str) -> None:
    with InnocentStream(server, max_tokens=200):
        status, data = post(server, "/v1/completions", raw)
    assert_openai_error(status, data, 400)
    assert data["error"]["param"] == param


def test_lone_surrogate_in_a_chat_message_is_a_400(server: ServerThread) -> None:
    raw = b'{"messages": [{"role": "user", "content": "x\\ud800"}]}'
    status, data = post(server, "/v1/chat/completions", raw)
    assert_openai_error(status, data, 400)
    assert data["error"]["param"] == "messages"


# -- 6: a chunk per token, max_tokens past the context, forgotten ids ---------------------------


def test_incomplete_characters_still_make_a_chunk_per_token(tiny_dir: Path) -> None:
    from tokenizers import Tokenizer

    tok = CheckpointTokenizer(Tokenizer.from_file(str(tiny_dir / "tokenizer.json")))
    ids = tok.encode("a🎉b", add_special_tokens=False)
    assert len(ids) > 3  # the emoji is several byte tokens
    gen = GenerationRequest(
        chat=True,
        prompts=[[1]],
        params=SamplingParams(max_tokens=len(ids)),
        stream=True,
        include_usage=False,
        logprobs=False,
    )
    completion = Completion("c", "tiny", gen, tok)
    chunks = [
        completion.update(RequestOutput("c", 0, [t], i == len(ids) - 1, None))
        for i, t in enumerate(ids)
    ]
    assert all(c is not None for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "a🎉b"


def test_streams_send_one_chunk_per_token(server: ServerThread) -> None:
    with InnocentStream(server, max_tokens=64, prompt="日本語 🎉 naïve"):
        pass  # InnocentStream checks 64 chunks for 64 tokens


def test_max_tokens_past_the_context_is_refused(server: ServerThread) -> None:
    limit = server.served.max_model_len
    with InnocentStream(server, max_tokens=200):
        status, data = _completion(server, max_tokens=limit)
    assert_openai_error(status, data, 400)
    assert data["error"]["param"] == "max_tokens"
    assert data["error"]["code"] == "context_length_exceeded"
    status, data = _completion(server, prompt=[5] * limit)  # no room for one token
    assert_openai_error(status, data, 400)
    assert data["error"]["param"] == "prompt"


def test_the_engine_forgets_the_ids_of_served_requests(server: ServerThread) -> None:
    for _ in range(5):
        assert _completion(server)[0] == 200
    with InnocentStream(server, max_tokens=50):
        pass
    engine = server.async_engine.engine
    deadline = time.monotonic() + 10
    while server.call(engine.has_unfinished_requests) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.call(lambda: len(engine._used_ids)) == 0
