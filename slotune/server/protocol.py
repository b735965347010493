"""OpenAI request bodies in, engine requests out; OpenAI-style errors.

Accepted fields: ``model``, ``prompt`` (a string, a list of token ids, or a list holding
one of those) or ``messages``, ``max_tokens`` (chat also ``max_completion_tokens``),
``temperature`` (below 1e-5: greedy, as in vLLM), ``top_p``, ``top_k`` (0 or -1: off),
``seed`` (a 64-bit signed integer), ``n``, ``stop_token_ids``, ``ignore_eos``,
``logprobs`` (completions: an integer k; chat: a boolean, with ``top_logprobs`` k): each
token's logprob and the k most likely alternatives, k at most ``MAX_LOGPROBS`` (20, as
vLLM; see ``logprobs.py``), ``stream``, ``stream_options.include_usage``, ``stop``
(strings: the text ends before the first one, finish reason "stop"), and fields that
change nothing (``user``), and ``priority`` (vLLM's extra parameter: an integer, lower
served first under ``--scheduling-policy priority``; any other value but 0 is refused
under fcfs, as vLLM does). ``prompt`` may be a batch (a list of prompts): one engine
request each, choices indexed ``prompt * n + completion`` as vLLM does. A field slotune
cannot honour is refused with a 400 naming it (see ``_UNSUPPORTED``) rather than
silently ignored: penalties, ``best_of``, tools, response formats, guided decoding,
``echo`` with ``logprobs`` or in chat (``echo`` alone starts each completion with its
prompt).

Over a simulated engine, ``seed`` changes nothing (simulated tokens are a function of the
request id and position) and ``stop_token_ids`` are never sampled (simulated requests end
by ``max_tokens``, unless they cover every token the simulator draws: then the first
token stops the request); both are accepted so that benchmark clients need no changes.
Logprobs there are synthetic (``logprobs.synthetic``): the simulator has no model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from slotune.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from slotune.server.served import ServedModel
from slotune.server.text import render_chat

# Sizes are checked before anything proportional to them is built or iterated.
MAX_CHOICES = 4096  # prompts x n in one request: the choices its response holds
MAX_STOP_STRINGS = 64  # each is searched for in every choice's text after every token
MAX_STOP_CHARS = 512  # a stop string's length: the text held back while streaming
MAX_MODEL_NAME_SHOWN = 100  # characters of an unknown model name quoted in the 404
DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default; chat defaults to the room left
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1  # vLLM's bounds (torch.long)

# field -> the values that change nothing (anything else is refused, naming the field)
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (1,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logit_bias": ({},),
    "suffix": ("",),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "min_tokens": (0,),
    "prompt_logprobs": (0,),
    "use_beam_search": (False,),
    "include_stop_str_in_output": (False,),
    # vLLM's other fields that change the output
    "min_p": (0, 0.0),
    "length_penalty": (1, 1.0),
    "allowed_token_ids": (),
    "bad_words": ([],),
    "truncate_prompt_tokens": (),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "return_tokens_as_token_ids": (False,),
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "chat_template": (),
    "chat_template_kwargs": ({},),
    "structured_outputs": (),
    "prediction": (),
    "modalities": (["text"],),
    "audio": (),
}


class InvalidRequest(ValueError):
    """A client error: answered with HTTP ``status`` (400) naming ``param``."""

    def __init__(
        self, message: str, param: str | None = None, code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


def error_type(status: int) -> str:
    """The OpenAI error ``type`` of an HTTP error status."""
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(
    message: str,
    param: str | None = None,
    code: str | None = None,
    type_: str = "invalid_request_error",
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass(frozen=True)
class GenerationRequest:
    """``prompts``: one engine request each (completions take a batch; chat one)."""

    chat: bool
    prompts: list[list[int]]
    params: SamplingParams
    stream: bool
    include_usage: bool
    logprobs: bool  # the number of alternatives per token is ``params.logprobs``
    stop: tuple[str, ...] = ()
    echo: tuple[str, ...] = ()  # with ``echo``: each prompt's text, to start its choices
    priority: int = 0  # vLLM's ``priority`` extra parameter (lower first)


def parse_request(body: Any, served: ServedModel, *, chat: bool) -> GenerationRequest:
    """Check ``body`` and tokenize its prompts (slow for long prompts: run it off the event
    loop). Raises ``InvalidRequest``."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    check_model(body.get("model"), served)
    _refuse_unsupported(body)
    prompt_field = "messages" if chat else "prompt"
    if prompt_field not in body:
        raise InvalidRequest(f"'{prompt_field}' is required", prompt_field, "missing_required")
    n = _n(body, served)
    stop = _stop_strings(body.get("stop"))
    include_usage = _include_usage(body)
    chat_ids = _chat_prompt(body["messages"], served) if chat else None
    if chat_ids is not None:
        prompts = [chat_ids]
    else:
        prompts = _prompts(body["prompt"], served, max_prompts=MAX_CHOICES // n)
    for ids in prompts:
        _check_prompt_ids(ids, served, prompt_field)
    logprobs, top = _logprobs(body, chat)
    echo = _typed(body, "echo", bool, False)
    if echo and (chat or logprobs):
        raise InvalidRequest(
            "'echo' works on /v1/completions without 'logprobs' (slotune does not compute "
            "the prompt's logprobs)",
            "echo",
        )
    longest = max(len(ids) for ids in prompts)
    return GenerationRequest(
        chat=chat,
        prompts=prompts,
        params=_sampling_params(body, longest, served, chat, top, n),
        stream=_typed(body, "stream", bool, False),
        include_usage=include_usage,
        logprobs=logprobs,
        stop=stop,
        echo=_echo_texts(body["prompt"], prompts, served) if echo else (),
        priority=_priority(body),
    )


def _priority(body: dict[str, Any]) -> int:
    """vLLM's ``priority``: an integer (0 when absent)."""
    from slotune.workloads.limits import MAX_PRIORITY

    value = body.get("priority")
    if value is None:
        return 0
    if not _is_int(value) or not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidRequest(
            f"'priority' must be an integer in [-{MAX_PRIORITY}, {MAX_PRIORITY}] "
            f"(got {_short(value)})",
            "priority",
        )
    return int(value)


def _n(body: dict[str, Any], served: ServedModel) -> int:
    """``n``, bounded by the engine's ``max_num_seqs`` before anything is made per choice."""
    n = _typed(body, "n", int, 1)
    if n < 1:
        raise InvalidRequest(f"'n' must be at least 1 (got {_short(n)})", "n")
    limit = min(served.max_num_seqs or MAX_CHOICES, MAX_CHOICES)
    if n > limit:
        raise InvalidRequest(
            f"'n' is {_short(n)}, more than {limit} (this server's max_num_seqs): its "
            "completions could never run together",
            "n",
        )
    return int(n)


def _include_usage(body: dict[str, Any]) -> bool:
    options = _typed(body, "stream_options", dict, None) or {}
    value = options.get("include_usage")
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(
            f"'stream_options.include_usage' must be a boolean (got {_short(value)})",
            "stream_options",
        )
    return bool(value)


def _logprobs(body: dict[str, Any], chat: bool) -> tuple[bool, int]:
    """Whether to return logprobs, and how many alternatives per token: completions'
    ``logprobs`` is that number; chat's is a boolean, the number ``top_logprobs``."""
    if chat:
        wanted = _typed(body, "logprobs", bool, False)
        top, field = _typed(body, "top_logprobs", int, 0), "top_logprobs"
        if top and not wanted:
            raise InvalidRequest("'top_logprobs' needs 'logprobs': true", field)
    else:
        top, field = _typed(body, "logprobs", int, None), "logprobs"
        wanted, top = top is not None, top or 0
    if not 0 <= top <= MAX_LOGPROBS:
        raise InvalidRequest(
            f"'{field}' must be in [0, {MAX_LOGPROBS}] (got {top}), the most alternatives "
            "per token this server returns",
            field,
        )
    return wanted, top


def _echo_texts(prompt: Any, prompts: list[list[int]], served: ServedModel) -> tuple[str, ...]:
    """Each prompt's text as the client sent it (token ids decoded)."""
    batch = isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt)
    raw = prompt if batch else [prompt]
    return tuple(
        p if isinstance(p, str) else served.tokenizer.decode(ids)
        for p, ids in zip(raw, prompts, strict=True)
    )


def _stop_strings(stop: Any) -> tuple[str, ...]:
    """``stop``: a string or a list of strings; the text ends before the first one found."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if isinstance(stops, list) and len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest(
            f"'stop' holds {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed", "stop"
        )
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest("'stop' must be a string or a list of strings", "stop")
    longest = max(map(len, stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise InvalidRequest(
            f"a 'stop' string is {longest} characters; at most {MAX_STOP_CHARS} are allowed",
            "stop",
        )
    return tuple(s for s in stops if s)


def parse_tokenize(body: Any, served: ServedModel) -> list[int]:
    """``/tokenize``: the token ids of ``prompt`` or of the chat prompt of ``messages``."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    check_model(body.get("model"), served)
    specials = _typed(body, "add_special_tokens", bool, True)
    if "messages" in body:
        return _chat_prompt(body["messages"], served)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidRequest("'prompt' (a string) or 'messages' is required", "prompt")
    return encode_text(prompt, served, "prompt", specials)


def parse_detokenize(body: Any, served: ServedModel) -> list[int]:
    """``/detokenize``: the token ids to turn into text, each in the vocabulary."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    check_model(body.get("model"), served)
    tokens = body.get("tokens")
    if isinstance(tokens, list) and len(tokens) > served.max_model_len:
        raise InvalidRequest(
            f"'tokens' holds {len(tokens)} token ids, more than this server's "
            f"max_model_len={served.max_model_len}",
            "tokens",
            "context_length_exceeded",
        )
    if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
        raise InvalidRequest("'tokens' must be a list of token ids", "tokens")
    bad = next((t for t in tokens if not 0 <= t < served.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            f"token id {bad} is outside the vocabulary [0, {served.vocab_size})", "tokens"
        )
    return tokens


def check_model(model: Any, served: ServedModel) -> None:
    """A named model must be the one served: 404 otherwise, as vLLM answers."""
    if model is None:
        return
    if model != served.name:
        shown = _short(model, MAX_MODEL_NAME_SHOWN)
        raise InvalidRequest(
            f"The model {shown} does not exist; this server serves `{served.name}`",
            "model",
            "model_not_found",
            status=404,
        )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, harmless in _UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and not any(_same(value, h) for h in harmless):
            raise InvalidRequest(
                f"'{name}' is not supported by slotune's server (got {_short(value)})", name
            )


def _same(value: Any, harmless: Any) -> bool:
    """Equal and of the same kind (``0`` is not ``False``; ``0`` is ``0.0``)."""
    if isinstance(value, bool) or isinstance(harmless, bool):
        return value is harmless
    if isinstance(value, (int, float)) and isinstance(harmless, (int, float)):
        return value == harmless
    return type(value) is type(harmless) and value == harmless


def _short(value: Any, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters (a long string is cut before its repr)."""
    if isinstance(value, str) and len(value) > width:
        value = value[:width]
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _prompts(prompt: Any, served: ServedModel, max_prompts: int) -> list[list[int]]:
    """A string, a list of token ids, or a batch of at most ``max_prompts``: a list of those."""
    if isinstance(prompt, str):
        return [encode_text(prompt, served, "prompt")]
    if isinstance(prompt, list) and prompt and _is_int(prompt[0]):
        _check_length(len(prompt), served, "prompt")
        if all(_is_int(t) for t in prompt):
            return [list(prompt)]
    if isinstance(prompt, list) and len(prompt) > max_prompts:
        raise InvalidRequest(
            f"'prompt' is a batch of {len(prompt)} prompts; with 'n' completions each, at most "
            f"{max_prompts} are allowed ({MAX_CHOICES} choices)",
            "prompt",
        )
    if isinstance(prompt, list) and prompt and not _is_int(prompt[0]):
        batch = []
        for p in prompt:
            if isinstance(p, str):
                batch.append(encode_text(p, served, "prompt"))
            elif isinstance(p, list) and p and _is_int(p[0]):
                _check_length(len(p), served, "prompt")
                if not all(_is_int(t) for t in p):
                    break
                batch.append(list(p))
            else:
                break
        else:
            return batch
    raise InvalidRequest(
        "'prompt' must be a string, a list of token ids, or a non-empty list of those",
        "prompt",
    )


def encode_text(
    text: str, served: ServedModel, field: str, add_special_tokens: bool = True
) -> list[int]:
    """The text's token ids; refused without tokenizing when it is certainly longer than
    ``max_model_len`` (a huge prompt would hold a worker for seconds), or not valid
    Unicode (a lone surrogate)."""
    limit = served.max_model_len * served.max_token_chars + 16
    if len(text) > limit:
        raise InvalidRequest(
            f"'{field}' is {len(text)} characters, more than the {limit} that "
            f"max_model_len={served.max_model_len} tokens can hold",
            field,
            "context_length_exceeded",
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"'{field}' is not valid Unicode: {exc.reason} at character {exc.start}", field
        ) from None
    return served.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _chat_prompt(messages: Any, served: ServedModel) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of messages", "messages")
    _check_length(len(messages), served, "messages")  # a message is at least a token
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
    return encode_text(text, served, "messages", served.chat_template is None)


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


def _check_length(num_tokens: int, served: ServedModel, field: str) -> None:
    """At least ``num_tokens`` prompt tokens must leave room for one generated token."""
    if num_tokens >= served.max_model_len:
        raise InvalidRequest(
            f"'{field}' is {num_tokens} tokens: with at least one token to generate it does not "
            f"fit this server's max_model_len={served.max_model_len}",
            field,
            "context_length_exceeded",
        )


def _check_prompt_ids(ids: list[int], served: ServedModel, field: str) -> None:
    if not ids:
        raise InvalidRequest(f"'{field}' is empty; it needs at least one token", field)
    _check_length(len(ids), served, field)
    bad = next((t for t in ids if t < 0 or t >= served.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(
            f"token id {bad} is outside the vocabulary [0, {served.vocab_size})", field
        )


def _sampling_params(
    body: dict[str, Any], prompt_len: int, served: ServedModel, chat: bool, logprobs: int, n: int
) -> SamplingParams:
    room = served.max_model_len - prompt_len
    max_tokens = _typed(body, "max_tokens", int, None)
    name = "max_tokens"
    if chat and max_tokens is None:
        max_tokens = _typed(body, "max_completion_tokens", int, None)
        name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens = room if chat else min(DEFAULT_MAX_TOKENS, room)
    if max_tokens < 1:
        raise InvalidRequest(f"'{name}' must be at least 1 (got {max_tokens})", name)
    if max_tokens > room:
        raise InvalidRequest(
            f"'{name}' is {max_tokens}, but the prompt's {prompt_len} tokens leave room for "
            f"{room} of this server's max_model_len={served.max_model_len}",
            name,
            "context_length_exceeded",
        )
    top_k = _typed(body, "top_k", int, 0)
    stops = _typed(body, "stop_token_ids", list, None) or []
    if len(stops) > served.vocab_size:
        raise InvalidRequest(
            f"'stop_token_ids' holds {len(stops)} ids, more than the vocabulary's "
            f"{served.vocab_size}",
            "stop_token_ids",
        )
    if not all(_is_int(t) for t in stops):
        raise InvalidRequest("'stop_token_ids' must be a list of token ids", "stop_token_ids")
    seed = _typed(body, "seed", int, None)
    if seed is not None and not SEED_MIN <= seed <= SEED_MAX:
        raise InvalidRequest(
            f"'seed' must be a 64-bit signed integer, in [{SEED_MIN}, {SEED_MAX}]", "seed"
        )
    fields = {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 1.0),  # tiny ones: greedy
        "top_p": _number(body, "top_p", 1.0),
        "top_k": 0 if top_k == -1 else top_k,
        "seed": seed,
        "n": n,
        "stop_token_ids": tuple(stops),
        "ignore_eos": _typed(body, "ignore_eos", bool, False),
        "logprobs": logprobs,
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
        raise InvalidRequest(f"'{name}' must be {_TYPE_NAMES[kind]} (got {_short(value)})", name)
    return value


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"'{name}' must be a number (got {_short(value)})", name)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InvalidRequest(f"'{name}' must be a finite number (got {_short(value)})", name)
    return number


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
