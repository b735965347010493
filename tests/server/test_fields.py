"""Request fields that work as in vLLM: stop strings, batched prompts; harmless defaults."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest

from tests.server.conftest import ServerThread
from tests.server.helpers import post, scrape

PROMPTS = ["The quick brown fox", "Once upon a time", "Hello"]


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def _greedy(client: openai.OpenAI, prompt: Any, **kwargs: Any) -> Any:
    return client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=kwargs.pop("max_tokens", 40),
        temperature=0,
        extra_body={"ignore_eos": True},
        **kwargs,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_end_the_text_before_the_first_one(
    server: ServerThread, client: openai.OpenAI, stream: bool
) -> None:
    full = _greedy(client, PROMPTS[0]).choices[0].text
    late, early = full[20:23], full[8:10]
    expected = full[: min(full.find(late), full.find(early))]
    aborted = server.async_engine.num_aborted
    if stream:
        chunks = list(_greedy(client, PROMPTS[0], stop=[late, early], stream=True))
        text = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
        assert all(late not in c.choices[0].text for c in chunks)
    else:
        r = _greedy(client, PROMPTS[0], stop=[late, early])
        text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert r.usage is not None and r.usage.completion_tokens < 40
    assert text == expected and reason == "stop"
    assert server.async_engine.num_aborted == aborted  # ended for its client, not abandoned


def test_a_stop_string_on_one_choice_leaves_the_other(client: openai.OpenAI) -> None:
    ref = [_greedy(client, p).choices[0].text for p in PROMPTS[:2]]
    stop = ref[0][5:8]
    assert stop not in ref[1]
    r = _greedy(client, PROMPTS[:2], stop=stop)
    texts = {c.index: (c.text, c.finish_reason) for c in r.choices}
    assert texts[0] == (ref[0][: ref[0].find(stop)], "stop")
    assert texts[1] == (ref[1], "length")


@pytest.mark.parametrize("stream", [False, True])
def test_batched_prompts_are_one_request_each(
    server: ServerThread, client: openai.OpenAI, stream: bool
) -> None:
    single = [_greedy(client, p, max_tokens=10) for p in PROMPTS]
    ids = post(server, "/tokenize", {"prompt": PROMPTS[2]})[1]["tokens"]
    batch_prompts: list[Any] = [PROMPTS[0], PROMPTS[1], ids]  # text and token ids mixed
    if stream:
        chunks = list(
            _greedy(
                client,
                batch_prompts,
                max_tokens=10,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        texts = [
            "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
            for i in range(3)
        ]
        usage = chunks[-1].usage
    else:
        r = _greedy(client, batch_prompts, max_tokens=10)
        assert sorted(c.index for c in r.choices) == [0, 1, 2]
        texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
        usage = r.usage
    assert texts == [s.choices[0].text for s in single]
    assert usage is not None and usage.completion_tokens == 30
    assert usage.prompt_tokens == sum(s.usage.prompt_tokens for s in single)  # type: ignore[union-attr]


def test_batched_prompts_with_n_index_choices_as_vllm(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="tiny", prompt=PROMPTS[:2], max_tokens=4, n=2, seed=7, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    one = client.completions.create(
        model="tiny", prompt=PROMPTS[1], max_tokens=4, n=2, seed=7, extra_body={"ignore_eos": True}
    )
    # prompt 1's completions are choices 2 and 3, as prompt 0 of a request of its own
    by_index = {c.index: c.text for c in r.choices}
    assert [by_index[2], by_index[3]] == [
        c.text for c in sorted(one.choices, key=lambda c: c.index)
    ]


@pytest.mark.parametrize(
    "field",
    [
        {"presence_penalty": 0},
        {"frequency_penalty": 0.0},
        {"repetition_penalty": 1},
        {"best_of": 1},
        {"echo": False},
        {"echo": True},
        {"stop": []},
        {"stop": ""},
        {"logit_bias": {}},
        {"user": "someone"},
        {"min_p": 0.0},
        {"skip_special_tokens": True},
        {"length_penalty": 1},
    ],
)
def test_fields_at_their_neutral_value_are_accepted(server: ServerThread, field: dict) -> None:
    status, data = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2} | field)
    assert status == 200, data


def test_chat_accepts_neutral_tools_and_text_format(server: ServerThread) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "tools": [],
        "response_format": {"type": "text"},
    }
    status, data = post(server, "/v1/chat/completions", body)
    assert status == 200, data


def test_a_prompt_ended_by_a_stop_string_stops_running_in_the_batch(
    server: ServerThread, client: openai.OpenAI
) -> None:
    """Prompt 0 stops early; prompt 1 runs 400 tokens: the engine stops prompt 0 at once
    rather than when the response ends."""
    ref = _greedy(client, PROMPTS[0], max_tokens=10).choices[0].text
    stop = ref[2:5]

    def generated() -> float:
        return scrape(server)["vllm:generation_tokens_total"]

    before = generated()
    r = _greedy(client, PROMPTS[:2], max_tokens=400, stop=stop)
    texts = {c.index: c.finish_reason for c in r.choices}
    assert texts == {0: "stop", 1: "length"}
    deadline = time.monotonic() + 10
    while server.call(server.async_engine.engine.has_unfinished_requests):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert 400 < generated() - before < 450  # not 800


@pytest.mark.parametrize("stream", [False, True])
def test_echo_starts_each_completion_with_its_prompt(
    server: ServerThread, client: openai.OpenAI, stream: bool
) -> None:
    ids = post(server, "/tokenize", {"prompt": PROMPTS[2], "add_special_tokens": False})[1]
    prompts: list[Any] = [PROMPTS[0], ids["tokens"]]  # text, and token ids (decoded)
    plain = [_greedy(client, p, max_tokens=6).choices[0].text for p in prompts]
    if stream:
        chunks = list(_greedy(client, prompts, max_tokens=6, echo=True, stream=True))
        texts = [
            "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in (0, 1)
        ]
    else:
        r = _greedy(client, prompts, max_tokens=6, echo=True)
        texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert texts == [PROMPTS[0] + plain[0], PROMPTS[2] + plain[1]]
