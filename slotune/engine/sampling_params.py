"""Per-request sampling parameters, named and bounded as in vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a smaller temperature samples greedily
MAX_LOGPROBS = 20  # vLLM's default max_logprobs: the most top alternatives per token


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    ignore_eos: bool = False
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    logprobs: int = 0  # the most likely alternatives reported with each token (vLLM's name)

    def __post_init__(self) -> None:
        stops = tuple(self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", stops)
        _check(
            "max_tokens",
            _is_int(self.max_tokens) and self.max_tokens >= 1,
            "must be an integer of at least 1",
            self.max_tokens,
        )
        _check("n", _is_int(self.n) and self.n >= 1, "must be an integer of at least 1", self.n)
        _check("temperature", self.temperature >= 0, "must be >= 0", self.temperature)
        _check("top_p", 0 < self.top_p <= 1, "must be in (0, 1]", self.top_p)
        _check(
            "top_k",
            _is_int(self.top_k) and self.top_k >= 0,
            "must be 0 (off) or a positive integer",
            self.top_k,
        )
        _check(
            "stop_token_ids",
            all(_is_int(t) and t >= 0 for t in stops),
            "must be non-negative integers",
            stops,
        )
        _check(
            "logprobs",
            _is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS,
            f"must be an integer in [0, {MAX_LOGPROBS}]",
            self.logprobs,
        )
        _check("seed", self.seed is None or _is_int(self.seed), "must be an integer", self.seed)

    @property
    def greedy(self) -> bool:
        """Below ``GREEDY_BELOW``, dividing the logits by the temperature would overflow
        them (to inf and NaN in float32)."""
        return self.temperature < GREEDY_BELOW


@cache
def exact_length(max_tokens: int) -> SamplingParams:
    """Sampling of exactly ``max_tokens`` tokens, EOS ignored: a replayed or recorded
    request's (as ``vllm bench serve`` sends them); one shared instance per length (they
    are frozen)."""
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(name: str, ok: bool, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name}: {rule} (got {value!r})")
