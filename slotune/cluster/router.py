"""The router: which instance a request goes to, from what a router in front of the
instances knows at that moment.

A router counts its own outstanding requests per instance (sent and not yet answered in
full), reads each instance's KV-cache usage as its metrics last reported it (the end of
the instance's last step), and, for prefix-aware routing, remembers the prompts it sent
where (in blocks of ``RouterSpec.block_tokens``, chained hashes as vLLM's prefix cache and
llm-d's scorer keep them; nothing is ever evicted from this memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slotune.cluster.spec import RouterSpec


@dataclass(frozen=True)
class Decision:
    """One routing decision, for the report."""

    time: float
    index: int  # the trace request
    instance: int
    reason: str  # "rr", "least-outstanding", "least-kv", "prefix", "balance", "no-match"
    matched_tokens: int = 0


def block_hashes(prompt: Sequence[int], block_tokens: int) -> list[int]:
    """Chained hashes of the prompt's full blocks: the k-th names the first k+1 blocks."""
    out = []
    h = 0
    for k in range(0, len(prompt) - block_tokens + 1, block_tokens):
        h = hash((h, tuple(prompt[k : k + block_tokens])))
        out.append(h)
    return out


def argmin(values: Sequence[float]) -> int:
    """The first index of the smallest value (ties go to the lowest index)."""
    best = 0
    for j in range(1, len(values)):
        if values[j] < values[best]:
            best = j
    return best


class Router:
    """Chooses among ``num_instances`` candidates (indexes into the caller's list)."""

    def __init__(self, spec: RouterSpec, num_instances: int) -> None:
        self.spec = spec
        self.n = num_instances
        self._next = 0
        self._seen: list[set[int]] = [set() for _ in range(num_instances)]

    def choose(
        self, prompt: Sequence[int], outstanding: Sequence[int], kv_usage: Sequence[float]
    ) -> tuple[int, str, int]:
        """(candidate, reason, prefix tokens the candidate was matched on)."""
        policy = self.spec.policy
        if policy == "round-robin":
            j = self._next
            self._next = (j + 1) % self.n
            return j, "rr", 0
        if policy == "least-outstanding":
            return argmin(outstanding), "least-outstanding", 0
        if policy == "least-kv":
            # ties (an idle cluster reports 0 everywhere) go to the fewest outstanding
            key = [kv * (1 << 20) + o for kv, o in zip(kv_usage, outstanding, strict=True)]
            return argmin(key), "least-kv", 0
        return self._prefix_aware(prompt, outstanding)

    def _prefix_aware(
        self, prompt: Sequence[int], outstanding: Sequence[int]
    ) -> tuple[int, str, int]:
        spec = self.spec
        hashes = block_hashes(prompt, spec.block_tokens)
        lo, hi = min(outstanding), max(outstanding)
        balanced = hi - lo <= spec.balance_abs or hi <= spec.balance_rel * lo
        choice, reason, matched = argmin(outstanding), "balance", 0
        if balanced:
            counts = [self._matched_blocks(j, hashes) for j in range(self.n)]
            best = max(range(self.n), key=lambda j: (counts[j], -outstanding[j], -j))
            matched = counts[best] * spec.block_tokens
            if prompt and matched >= spec.cache_threshold * len(prompt) and matched > 0:
                choice, reason = best, "prefix"
            else:
                reason, matched = "no-match", 0
        self._seen[choice].update(hashes)
        return choice, reason, matched

    def _matched_blocks(self, j: int, hashes: list[int]) -> int:
        seen = self._seen[j]
        k = 0
        for h in hashes:
            if h not in seen:
                break
            k += 1
        return k
