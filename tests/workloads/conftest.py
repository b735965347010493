"""A tiny deterministic engine for testing the runner's bookkeeping without the real core."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from slotune.engine.outputs import RequestOutput, StepStats
from slotune.engine.sampling_params import SamplingParams


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    max_tokens: int
    arrival: float
    out: list[int] = field(default_factory=list)
    prefilled: bool = False
    cached: int = 0


class FakeEngine:
    """Continuous batching in its simplest form: whole prompts prefill in one step (FIFO,
    within ``budget``), every running request decodes one token per step. A step costs
    ``base_s + per_token_s * tokens``. Output token = position + 1000 (so prompts that
    include a parent's output are recognisable). Full 16-token prefix blocks seen before
    count as cached."""

    def __init__(
        self,
        budget: int = 256,
        base_s: float = 0.01,
        per_token_s: float = 0.0001,
        max_len: int = 4096,
    ) -> None:
        self.budget, self.base_s, self.per_token_s, self.max_len = (
            budget,
            base_s,
            per_token_s,
            max_len,
        )
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.added: dict[str, tuple[list[int], float]] = {}
        self.tokens_checked: dict[str, bool] = {}  # what the runner said of each prompt
        self.aborted: list[str] = []
        self.last_step: StepStats | None = None
        self._blocks: set[int] = set()
        self._queries = self._hits = self._steps = 0

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        arrival_time: float = 0.0,
        *,
        priority: int = 0,
        tier: int = 0,
        tokens_checked: bool = False,
    ) -> _Req:
        self.tokens_checked[request_id] = tokens_checked
        if len(prompt_token_ids) > self.max_len:
            raise ValueError(
                f"prompt of {len(prompt_token_ids)} tokens exceeds max_model_len {self.max_len}"
            )
        assert params is not None and params.ignore_eos
        return _Req(request_id, list(prompt_token_ids), params.max_tokens, arrival_time)

    def enqueue(self, request: _Req) -> None:
        self.added[request.rid] = (list(request.prompt), request.arrival)
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.waiting = [r for r in self.waiting if r.rid != request_id]
        self.running = [r for r in self.running if r.rid != request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def _cache(self, r: _Req) -> None:
        h = 0
        for s in range(0, len(r.prompt) - 15, 16):
            h = hash((h, *r.prompt[s : s + 16]))
            self._queries += 16
            if h in self._blocks:
                self._hits += 16
                r.cached += 16
            self._blocks.add(h)

    def step(self) -> list[RequestOutput]:
        decode = len(self.running)
        prefill = 0
        while self.waiting:
            n = len(self.waiting[0].prompt)
            if prefill + n + decode > self.budget and (prefill or decode):
                break
            r = self.waiting.pop(0)
            self._cache(r)
            prefill += n
            self.running.append(r)
        outputs = []
        for r in list(self.running):
            r.out.append(1000 + len(r.out))
            done = len(r.out) >= r.max_tokens
            outputs.append(
                RequestOutput(
                    request_id=r.rid,
                    index=0,
                    new_token_ids=[r.out[-1]],
                    finished=done,
                    finish_reason="length" if done else None,
                    num_prompt_tokens=len(r.prompt),
                    num_cached_tokens=r.cached,
                )
            )
            if done:
                self.running.remove(r)
        tokens = prefill + decode
        self._steps += 1
        self.last_step = StepStats(
            duration_s=self.base_s + self.per_token_s * tokens,
            num_scheduled_tokens=tokens,
            num_prefill_tokens=prefill,
            num_decode_tokens=decode,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=0.5,
            num_preempted=0,
        )
        return outputs

    def stats(self) -> dict[str, Any]:
        return {
            "num_preemptions": 0,
            "prefix_cache_queries_tokens": self._queries,
            "prefix_cache_hit_tokens": self._hits,
            "steps": self._steps,
        }


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()
