"""OpenAI response bodies and stream chunks, built up from the engine's outputs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from slotune.engine.outputs import RequestOutput
from slotune.engine.server.protocol import GenerationRequest
from slotune.engine.server.text import IncrementalDetokenizer, TextTokenizer


@dataclass
class _Choice:
    detok: IncrementalDetokenizer
    text: list[str] = field(default_factory=list)
    num_tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[tuple[str, float | None]] = field(default_factory=list)  # (token, logprob)
    num_logprobs_sent: int = 0


class Completion:
    """The state of one request's choices; ``update`` turns an output into a chunk."""

    def __init__(
        self, request_id: str, model: str, gen: GenerationRequest, tokenizer: TextTokenizer
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.gen = gen
        self.tokenizer = tokenizer
        self.created = int(time.time())
        self.choices = [_Choice(IncrementalDetokenizer(tokenizer)) for _ in range(gen.params.n)]
        self.num_open = gen.params.n
        self.num_cached_tokens = 0
        self.object = "chat.completion" if gen.chat else "text_completion"

    @property
    def done(self) -> bool:
        return self.num_open == 0

    def update(self, out: RequestOutput) -> dict[str, Any]:
        """Record ``out``; the stream chunk it makes: one per output, so one per token, its
        text empty while an incomplete character is held back (as vLLM streams)."""
        c = self.choices[out.index]
        self.num_cached_tokens = max(self.num_cached_tokens, out.num_cached_tokens)
        c.num_tokens += len(out.new_token_ids)
        if self.gen.logprobs:
            lps: list[float | None] = list(out.logprobs)
            lps += [None] * (len(out.new_token_ids) - len(lps))
            decode = self.tokenizer.decode
            c.logprobs.extend(
                (decode([t]), lp) for t, lp in zip(out.new_token_ids, lps, strict=True)
            )
        delta = c.detok.add(out.new_token_ids, final=out.finished)
        if out.finished:
            c.finish_reason = out.finish_reason
            self.num_open -= 1
        c.text.append(delta)
        choice: dict[str, Any] = {"index": out.index}
        if self.gen.chat:
            choice["delta"] = {"content": delta} if delta or not out.finished else {}
        else:
            choice["text"] = delta
        choice["logprobs"] = self._logprobs(c, c.num_logprobs_sent)
        c.num_logprobs_sent = len(c.logprobs)
        choice["finish_reason"] = c.finish_reason
        return self._chunk([choice])

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
        prompt = len(self.gen.prompt_token_ids)
        completion = sum(c.num_tokens for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.num_cached_tokens},
        }

    def body(self) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        choices = []
        for i, c in enumerate(self.choices):
            text = "".join(c.text)
            choice: dict[str, Any] = {"index": i}
            if self.gen.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = self._logprobs(c, 0)
            choice["finish_reason"] = c.finish_reason
            choices.append(choice)
        return {
            "id": self.request_id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": self.object + ".chunk" if self.gen.chat else self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, c: _Choice, start: int) -> dict[str, Any] | None:
        """Logprobs of the choice's tokens from ``start`` on, in OpenAI's shape."""
        if not self.gen.logprobs:
            return None
        entries = c.logprobs[start:]  # the sampled tokens only: top_logprobs is always 0
        if self.gen.chat:
            content = []
            for tok, lp in entries:
                item = {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))}
                content.append(item | {"top_logprobs": []})
            return {"content": content}
        offset = sum(len(tok) for tok, _ in c.logprobs[:start])
        offsets = []
        for tok, _ in entries:
            offsets.append(offset)
            offset += len(tok)
        return {
            "tokens": [tok for tok, _ in entries],
            "token_logprobs": [lp for _, lp in entries],
            "top_logprobs": None,
            "text_offset": offsets,
        }
