"""OpenAI request bodies in, engine requests out; OpenAI-style errors.

Accepted fields (others, such as ``user`` or penalties, are ignored as vLLM ignores what
it does not support): ``model``, ``prompt`` (a string, a list of token ids, or a list
holding one of those) or ``messages``, ``max_tokens`` (chat also
``max_completion_tokens``), ``temperature``, ``top_p``, ``top_k`` (0 or -1: off),
``seed``, ``n``, ``stop_token_ids``, ``ignore_eos``, ``logprobs`` (completions: an integer;
chat: a boolean with ``top_logprobs``), ``stream``, ``stream_options.include_usage``.
Only the sampled token's logprob is known, so ``top_logprobs`` lists that token alone.
Stop strings are refused: use ``stop_token_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slotune.engine.sampling_params import SamplingParams
from slotune.engine.server.served import ServedModel
from slotune.engine.server.text import render_chat

DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default; chat defaults to the room left


class InvalidRequest(ValueError):
    """A client error: answered with HTTP 400 naming ``param``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def error_body(
    message: str,
    param: str | None = None,
    code: str | None = None,
    type_: str = "invalid_request_error",
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass(frozen=True)
class GenerationRequest:
    chat: bool
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int


def parse_request(body: Any, served: ServedModel, *, chat: bool) -> GenerationRequest:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    _check_model(body.get("model"), served)
    prompt_field = "messages" if chat else "prompt"
    if prompt_field not in body:
        raise InvalidRequest(f"'{prompt_field}' is required", prompt_field, "missing_required")
    ids = _chat_prompt(body["messages"], served) if chat else _prompt(body["prompt"], served)
    _check_prompt_ids(ids, served, prompt_field)
    if chat:
        logprobs = _typed(body, "logprobs", bool, False)
        top = _typed(body, "top_logprobs", int, 0)
        if top and not logprobs:
            raise InvalidRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    else:
        top = _typed(body, "logprobs", int, None)
        logprobs = top is not None
        top = top or 0
    if top < 0:
        raise InvalidRequest(f"must be >= 0 (got {top})", "top_logprobs" if chat else "logprobs")
    stop = body.get("stop")
    if stop:
        raise InvalidRequest("stop strings are not supported; use 'stop_token_ids'", "stop")
    options = _typed(body, "stream_options", dict, None) or {}
    return GenerationRequest(
        chat=chat,
        prompt_token_ids=ids,
        params=_sampling_params(body, len(ids), served, chat),
        stream=_typed(body, "stream", bool, False),
        include_usage=bool(options.get("include_usage", False)),
        logprobs=logprobs,
        top_logprobs=top,
    )


def _check_model(model: Any, served: ServedModel) -> None:
    if model is None:
        return
    if model != served.name:
        raise InvalidRequest(
            f"model {model!r} is not served here; this server serves {served.name!r}",
            "model",
            "model_not_found",
        )


def _prompt(prompt: Any, served: ServedModel) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return served.tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        return list(prompt)
    raise InvalidRequest(
        "'prompt' must be a string or a list of token ids (one prompt per request)", "prompt"
    )


def _chat_prompt(messages: Any, served: ServedModel) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of messages", "messages")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequest(
                f"messages[{i}] must be an object with a string 'role'", "messages"
            )
        plain.append({"role": m["role"], "content": _content(m.get("content"), i)})
    try:
        text = render_chat(plain, served.chat_template, served.special_tokens)
    except ValueError as exc:
        raise InvalidRequest(str(exc), "messages") from None
    return served.tokenizer.encode(text, add_special_tokens=served.chat_template is None)


def _content(content: Any, i: int) -> str:
    """A string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise InvalidRequest(
        f"messages[{i}].content must be a string or a list of text parts", "messages"
    )


def _check_prompt_ids(ids: list[int], served: ServedModel, field: str) -> None:
    if not ids:
        raise InvalidRequest(f"'{field}' is empty; it needs at least one token", field)
    bad = next((t for t in ids if t < 0 or t >= served.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            f"token id {bad} is outside the vocabulary [0, {served.vocab_size})", field
        )
    if len(ids) > served.max_model_len:
        raise InvalidRequest(
            f"'{field}' is {len(ids)} tokens, longer than this server's max_model_len="
            f"{served.max_model_len}",
            field,
            "context_length_exceeded",
        )


def _sampling_params(
    body: dict[str, Any], prompt_len: int, served: ServedModel, chat: bool
) -> SamplingParams:
    room = max(served.max_model_len - prompt_len, 1)
    default = room if chat else DEFAULT_MAX_TOKENS
    max_tokens = _typed(body, "max_tokens", int, None)
    name = "max_tokens"
    if chat and max_tokens is None:
        max_tokens = _typed(body, "max_completion_tokens", int, None)
        name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens = default
    if max_tokens < 1:
        raise InvalidRequest(f"'{name}' must be at least 1 (got {max_tokens})", name)
    top_k = _typed(body, "top_k", int, 0)
    stops = _typed(body, "stop_token_ids", list, None) or []
    if not all(_is_int(t) for t in stops):
        raise InvalidRequest("'stop_token_ids' must be a list of token ids", "stop_token_ids")
    fields = {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 1.0),
        "top_p": _number(body, "top_p", 1.0),
        "top_k": 0 if top_k == -1 else top_k,
        "seed": _typed(body, "seed", int, None),
        "n": _typed(body, "n", int, 1),
        "stop_token_ids": tuple(stops),
        "ignore_eos": _typed(body, "ignore_eos", bool, False),
    }
    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        message = str(exc)
        field = message.removeprefix("SamplingParams.").split(":", 1)[0]
        raise InvalidRequest(message.removeprefix("SamplingParams."), field) from None


_TYPE_NAMES = {bool: "a boolean", int: "an integer", list: "a list", dict: "an object"}


def _typed(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    ok = _is_int(value) if kind is int else isinstance(value, kind)
    if not ok:
        raise InvalidRequest(f"'{name}' must be {_TYPE_NAMES[kind]} (got {value!r})", name)
    return value


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"'{name}' must be a number (got {value!r})", name)
    return float(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
