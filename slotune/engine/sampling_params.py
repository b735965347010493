"""Per-request sampling parameters, named and bounded as in vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"SamplingParams.max_tokens: must be an integer (got {self.max_tokens!r})")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens: must be at least 1 (got {self.max_tokens})")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"SamplingParams.n: must be an integer of at least 1 (got {self.n!r})")
        if not self.temperature >= 0:
            raise ValueError(f"SamplingParams.temperature: must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p: must be in (0, 1] (got {self.top_p})")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k: must be 0 (off) or a positive integer (got {self.top_k!r})")
        stops = tuple(self.stop_token_ids)
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in stops):
            raise ValueError(f"SamplingParams.stop_token_ids: must be non-negative integers (got {stops!r})")
        object.__setattr__(self, "stop_token_ids", stops)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
