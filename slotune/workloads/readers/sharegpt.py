"""ShareGPT JSON: ``[{"id", "conversations": [{"from", "value"}, ...]}, ...]``.

Default mode follows vLLM's ``sample_sharegpt_requests``: keep conversations with at
least two messages, take the first human/gpt pair, shuffle with the seed, then drop
pairs whose prompt or output is under 4 tokens, whose prompt is over 1024 tokens, or
whose prompt + output is over 2048, until ``num_requests`` are kept. The output length
is the token count of the recorded answer.

Multi-turn mode replays each conversation as one session: turn k sends the whole history
(earlier prompts and the engine's own answers) plus the k-th human message, and asks for
as many tokens as the recorded k-th answer. A conversation is cut at the first turn whose
context plus output would pass ``max_context_len``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slotune.workloads.readers.errors import DropCounter, TraceFormatError, read_text
from slotune.workloads.tokenizer import Tokenizer
from slotune.workloads.trace import Trace, TraceRequest

MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
_HUMAN = ("human", "user")
_GPT = ("gpt", "assistant", "chatgpt", "bard", "model")
_Entry = tuple[int, str, list[tuple[str, str]]]  # line, conversation id, (role, text) messages


def iter_json_array(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield (line number, entry) of a top-level JSON array, for errors that name the line."""
    text = read_text(path)
    decoder = json.JSONDecoder()
    pos, line = 0, 1

    def skip_ws(p: int) -> int:
        while p < len(text) and text[p] in " \t\r\n":
            p += 1
        return p

    def fail(p: int, msg: str) -> TraceFormatError:
        return TraceFormatError(path, f"line {text.count(chr(10), 0, p) + 1}", msg)

    pos = skip_ws(pos)
    if pos >= len(text) or text[pos] != "[":
        raise fail(pos, "expected a JSON array of conversations ('[' at the start)")
    pos = skip_ws(pos + 1)
    if pos < len(text) and text[pos] == "]":
        return
    last = 0
    while True:
        line += text.count("\n", last, pos)
        last = pos
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(
                path, f"line {exc.lineno}", f"invalid JSON ({exc.msg})"
            ) from None
        except (ValueError, RecursionError) as exc:  # a huge integer, nesting too deep
            raise fail(pos, f"invalid JSON ({str(exc)[:100]})") from None
        yield line, obj
        pos = skip_ws(end)
        if pos < len(text) and text[pos] == ",":
            pos = skip_ws(pos + 1)
        elif pos < len(text) and text[pos] == "]":
            return
        else:
            raise fail(pos, "expected ',' or ']' after an array entry")


def _messages(path: Path, line: int, entry: Any) -> list[tuple[str, str]]:
    if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
        raise TraceFormatError(
            path, f"line {line}", 'expected an object with a "conversations" list'
        )
    out: list[tuple[str, str]] = []
    for i, msg in enumerate(entry["conversations"]):
        if not isinstance(msg, dict) or not isinstance(msg.get("value"), str) or "from" not in msg:
            raise TraceFormatError(
                path,
                f"line {line}",
                f'conversations[{i}]: expected {{"from": ..., "value": "<text>"}}',
            )
        out.append((str(msg["from"]).lower(), msg["value"]))
    return out


def _pairs(messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(human, gpt) pairs in order; a leading system message is prepended to the first prompt."""
    system = "\n".join(v for r, v in messages if r == "system")
    pairs: list[tuple[str, str]] = []
    i = 0
    while i + 1 < len(messages):
        if messages[i][0] in _HUMAN and messages[i + 1][0] in _GPT:
            prompt = messages[i][1]
            if not pairs and system:
                prompt = system + "\n" + prompt
            pairs.append((prompt, messages[i + 1][1]))
            i += 2
        else:
            i += 1
    return pairs


def read_sharegpt(
    path: Path,
    tokenizer: Tokenizer,
    *,
    num_requests: int | None,
    seed: int,
    multi_turn: bool,
    max_context_len: int = 8192,
) -> Trace:
    entries = [
        (
            line,
            str(e.get("id", f"conv{n}")) if isinstance(e, dict) else "",
            _messages(path, line, e),
        )
        for n, (line, e) in enumerate(iter_json_array(path))
    ]
    dropped = DropCounter()
    if multi_turn:
        requests = _multi_turn(entries, tokenizer, num_requests, max_context_len, dropped)
    else:
        requests = _single_turn(entries, tokenizer, num_requests, seed, dropped)
    return Trace(
        name=path.stem + ("-multi-turn" if multi_turn else ""),
        requests=tuple(requests),
        seed=seed,
        dropped=dict(dropped),
        source=str(path),
        tokenizer=tokenizer.name,
    )


def _single_turn(
    entries: list[_Entry],
    tokenizer: Tokenizer,
    num_requests: int | None,
    seed: int,
    dropped: DropCounter,
) -> list[TraceRequest]:
    candidates: list[tuple[str, str, str]] = []
    for _, conv_id, messages in entries:
        if len(messages) < 2:
            dropped.drop("fewer than 2 messages")
            continue
        pairs = _pairs(messages)
        if not pairs:
            dropped.drop("no human/gpt pair")
            continue
        candidates.append((conv_id, *pairs[0]))
    random.Random(seed).shuffle(candidates)
    requests: list[TraceRequest] = []
    for conv_id, prompt, answer in candidates:
        if num_requests is not None and len(requests) >= num_requests:
            break
        ids = tokenizer.encode(prompt)
        output_len = len(tokenizer.encode(answer))
        reason = vllm_filter(len(ids), output_len)
        if reason:
            dropped.drop(reason)
            continue
        requests.append(
            TraceRequest(
                request_id=f"{conv_id}-{len(requests)}",
                prompt_len=len(ids),
                output_len=output_len,
                prompt_token_ids=tuple(ids),
                prompt_text=prompt,
            )
        )
    return requests


def vllm_filter(prompt_len: int, output_len: int) -> str | None:
    """vLLM's ShareGPT sampling rule: the reason a pair is dropped, or None to keep it."""
    if prompt_len < MIN_LEN:
        return f"prompt < {MIN_LEN} tokens"
    if output_len < MIN_LEN:
        return f"output < {MIN_LEN} tokens"
    if prompt_len > MAX_PROMPT_LEN:
        return f"prompt > {MAX_PROMPT_LEN} tokens"
    if prompt_len + output_len > MAX_TOTAL_LEN:
        return f"prompt + output > {MAX_TOTAL_LEN} tokens"
    return None


def _multi_turn(
    entries: list[_Entry],
    tokenizer: Tokenizer,
    num_requests: int | None,
    max_context_len: int,
    dropped: DropCounter,
) -> list[TraceRequest]:
    requests: list[TraceRequest] = []
    for n, (_, conv_id, messages) in enumerate(entries):
        if num_requests is not None and len(requests) >= num_requests:
            break
        pairs = _pairs(messages)
        if not pairs:
            dropped.drop("no human/gpt pair")
            continue
        session = f"{conv_id}#{n}"
        context = 0
        parent: str | None = None
        for turn, (prompt, answer) in enumerate(pairs):
            ids = tokenizer.encode(prompt)
            output_len = len(tokenizer.encode(answer))
            if not ids or output_len < 1:
                dropped.drop("turns after an empty message")
                dropped["turns after an empty message"] += len(pairs) - turn - 1
                break
            if context + len(ids) + output_len > max_context_len:
                dropped.drop(f"turns past {max_context_len} context tokens")
                dropped[f"turns past {max_context_len} context tokens"] += len(pairs) - turn - 1
                break
            rid = f"{session}-t{turn}"
            requests.append(
                TraceRequest(
                    request_id=rid,
                    prompt_len=len(ids),
                    output_len=output_len,
                    prompt_token_ids=tuple(ids),
                    prompt_text=prompt,
                    session_id=session,
                    turn=turn,
                    parent_id=parent,
                )
            )
            context += len(ids) + output_len
            parent = rid
    return requests
