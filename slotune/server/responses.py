"""OpenAI response bodies and stream chunks, built up from the engine's outputs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from slotune.engine.outputs import RequestOutput
from slotune.server.logprobs import (
    TokenLogprob,
    chat_logprobs,
    completion_logprobs,
    token_logprobs,
)
from slotune.server.protocol import GenerationRequest
from slotune.server.text import IncrementalDetokenizer, TextTokenizer


@dataclass
class _Choice:
    detok: IncrementalDetokenizer
    echo: str = ""  # the prompt's text, with ``echo``: sent with the first chunk
    text: str = ""  # all decoded so far; the client has ``text[:sent]``
    sent: int = 0
    num_tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    num_logprobs_sent: int = 0


class Completion:
    """The state of one response's choices; ``update`` turns an engine output into a chunk.

    A batch of prompts is one engine request per prompt (``request_ids``); choice
    ``p * n + i`` is completion ``i`` of prompt ``p``. Stop strings end a choice before the
    first one found; its engine request runs on until the caller aborts it, and its later
    outputs are dropped. While text streams, the last ``len(longest stop) - 1`` characters
    are held back, as vLLM holds them, so a stop string is never half sent.
    ``synthetic_vocab``: report synthetic logprobs over that vocabulary for outputs that
    have none (a simulated engine's).
    """

    def __init__(
        self,
        response_id: str,
        model: str,
        gen: GenerationRequest,
        tokenizer: TextTokenizer,
        *,
        synthetic_vocab: int | None = None,
    ) -> None:
        self.response_id = response_id
        self.synthetic_vocab = synthetic_vocab
        self.model = model
        self.gen = gen
        self.tokenizer = tokenizer
        self.created = int(time.time())
        n = gen.params.n
        batch = len(gen.prompts)
        self.request_ids = (
            [response_id] if batch == 1 else [f"{response_id}-{p}" for p in range(batch)]
        )
        self._prompt_index = {rid: p for p, rid in enumerate(self.request_ids)}
        self._engine_open = dict.fromkeys(self.request_ids, n)
        echo = gen.echo or ("",) * batch
        self.choices = [
            _Choice(IncrementalDetokenizer(tokenizer), echo[i // n]) for i in range(batch * n)
        ]
        self.num_open = batch * n
        self._hold = max((len(s) for s in gen.stop), default=1) - 1
        self._cached_tokens = dict.fromkeys(self.request_ids, 0)
        self.object = "chat.completion" if gen.chat else "text_completion"

    @property
    def done(self) -> bool:
        """Every choice has finished, for the engine or by a stop string."""
        return self.num_open == 0

    def running_request_ids(self) -> list[str]:
        """Engine requests not finished there: to abort when the response is done."""
        return [rid for rid, open_ in self._engine_open.items() if open_ > 0]

    def take_stopped_request_ids(self) -> list[str]:
        """Engine requests still running whose choices stop strings all ended: to abort
        now (each is returned once)."""
        n = self.gen.params.n
        stopped = [
            rid
            for rid, open_ in self._engine_open.items()
            if open_ > 0 and all(c.finish_reason for c in self._choices_of(rid, n))
        ]
        for rid in stopped:
            self._engine_open[rid] = 0
        return stopped

    def _choices_of(self, request_id: str, n: int) -> list[_Choice]:
        first = self._prompt_index[request_id] * n
        return self.choices[first : first + n]

    def update(self, out: RequestOutput) -> dict[str, Any] | None:
        """Record ``out``; the stream chunk it makes: one per output, so one per token (its
        text empty while held back), or None for a choice that a stop string ended."""
        rid = out.request_id
        if out.finished and self._engine_open[rid] > 0:
            self._engine_open[rid] -= 1
        index = self._prompt_index[rid] * self.gen.params.n + out.index
        c = self.choices[index]
        if c.finish_reason is not None:
            return None
        self._cached_tokens[rid] = max(self._cached_tokens[rid], out.num_cached_tokens)
        c.num_tokens += len(out.new_token_ids)
        if self.gen.logprobs:
            c.logprobs += token_logprobs(
                out,
                self.tokenizer.decode,
                top=self.gen.params.logprobs,
                synthetic_vocab=self.synthetic_vocab,
            )
        c.text += c.detok.add(out.new_token_ids, final=out.finished)
        end, reason = self._stop(c)
        if reason is None and out.finished:
            end, reason = len(c.text), out.finish_reason
        delta = c.text[c.sent : end] if end > c.sent else ""
        if c.echo:
            delta, c.echo = c.echo + delta, ""
        c.sent = max(c.sent, end)
        if reason is not None:
            c.text = c.text[: c.sent]
            c.finish_reason = reason
            self.num_open -= 1
        choice: dict[str, Any] = {"index": index}
        if self.gen.chat:
            choice["delta"] = {"content": delta} if delta or reason is None else {}
        else:
            choice["text"] = delta
        choice["logprobs"] = self._logprobs(c, c.num_logprobs_sent)
        c.num_logprobs_sent = len(c.logprobs)
        choice["finish_reason"] = c.finish_reason
        return self._chunk([choice])

    def _stop(self, c: _Choice) -> tuple[int, str | None]:
        """Where the choice's sendable text ends: before the first stop string (and then
        "stop"), or short of the held-back tail."""
        if self.gen.stop:
            found = [i for i in (c.text.find(s, c.sent) for s in self.gen.stop) if i >= 0]
            if found:
                return min(found), "stop"
        return len(c.text) - self._hold, None

    def role_chunk(self) -> dict[str, Any]:
        """Chat streams open each choice with the assistant role, as OpenAI's do; sent
        with the first token, so that a client's time to first chunk is its TTFT."""
        return self._chunk(
            [
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for i in range(len(self.choices))
            ]
        )

    def usage_chunk(self) -> dict[str, Any]:
        return self._chunk([]) | {"usage": self.usage()}

    def usage(self) -> dict[str, Any]:
        prompt = sum(len(ids) for ids in self.gen.prompts)
        completion = sum(c.num_tokens for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(self._cached_tokens.values())},
        }

    def body(self) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        choices = []
        for i, c in enumerate(self.choices):
            text = self.gen.echo[i // self.gen.params.n] + c.text if self.gen.echo else c.text
            choice: dict[str, Any] = {"index": i}
            if self.gen.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = self._logprobs(c, 0)
            choice["finish_reason"] = c.finish_reason
            choices.append(choice)
        return {
            "id": self.response_id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": self.object + ".chunk" if self.gen.chat else self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, c: _Choice, start: int) -> dict[str, Any] | None:
        """Logprobs of the choice's tokens from ``start`` on, in OpenAI's shape."""
        if not self.gen.logprobs:
            return None
        top = self.gen.params.logprobs
        if self.gen.chat:
            return chat_logprobs(c.logprobs[start:], top)
        offset = sum(len(e.token) for e in c.logprobs[:start])
        return completion_logprobs(c.logprobs[start:], offset, top)
