"""A test executor whose tokens are a function of (request, completion index, position).

It also keeps a model of the KV cache: every slot holds a fingerprint of the token prefix
whose KV it stores. Before each step it checks that every scheduled request's block table
maps its computed positions to the right fingerprints, so a wrong prefix-cache hit, a lost
copy-on-write or a bad swap shows up as a failed check, not as silently shared state.
"""

from __future__ import annotations

from slotune.engine.config import EngineConfig
from slotune.engine.executor import ExecutorOutput, KVCacheCapacity
from slotune.engine.request import Request
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.spec_decode import verified

VOCAB = 50_000


def token_for(parent_id: str, index: int, position: int) -> int:
    """The token completion ``index`` of request ``parent_id`` samples at ``position``."""
    return (hash((parent_id, index, position)) % (VOCAB - 2)) + 2


def fingerprints(token_ids: list[int], upto: int) -> list[int]:
    out = []
    h = 0
    for tok in token_ids[:upto]:
        h = hash((h, tok))
        out.append(h)
    return out


class DeterministicExecutor:
    def __init__(
        self,
        num_gpu_blocks: int = 1024,
        num_cpu_blocks: int = 0,
        *,
        check_kv: bool = True,
        step_duration_s: float = 0.01,
    ) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.check_kv = check_kv
        self.step_duration_s = step_duration_s
        self.outputs: list[SchedulerOutput] = []
        self.block_size = 0
        self.gpu: list[list[int | None]] = []
        self.cpu: list[list[int | None]] = []

    def determine_capacity(self, config: EngineConfig) -> KVCacheCapacity:
        return KVCacheCapacity(self.num_gpu_blocks, self.num_cpu_blocks)

    def initialize_cache(self, config: EngineConfig, capacity: KVCacheCapacity) -> None:
        self.block_size = config.block_size
        self.gpu = [[None] * config.block_size for _ in range(capacity.num_gpu_blocks)]
        self.cpu = [[None] * config.block_size for _ in range(capacity.num_cpu_blocks)]

    def execute(self, so: SchedulerOutput) -> ExecutorOutput:
        self.outputs.append(so)
        if self.check_kv:
            self._copy_and_check(so)
        sampled: dict[str, list[int]] = {}
        for rid, k in so.num_samples.items():
            req = so.requests[rid]
            position = req.num_computed_tokens + so.num_scheduled_tokens[rid]
            draft = so.spec_token_ids.get(rid)
            if draft:  # the tokens it samples after its last token and each draft token
                first = len(req.all_token_ids)
                target = [
                    token_for(req.parent_id, req.index, first + j) for j in range(len(draft) + 1)
                ]
                sampled[rid] = verified(draft, target)
            elif k == 1:
                sampled[rid] = [token_for(req.parent_id, req.index, position)]
            else:
                sampled[rid] = [token_for(req.parent_id, i, position) for i in range(k)]
        return ExecutorOutput(sampled_token_ids=sampled, duration_s=self.step_duration_s)

    def _copy_and_check(self, so: SchedulerOutput) -> None:
        bs = self.block_size
        for src, dst in so.swap_out:
            self.cpu[dst] = list(self.gpu[src])
        for src, dst in so.swap_in:
            self.gpu[dst] = list(self.cpu[src])
        for src, dst in so.copy_on_write:
            self.gpu[dst] = list(self.gpu[src])
        for rid, n in so.num_scheduled_tokens.items():
            req = so.requests[rid]
            table = so.block_tables[rid]
            start = req.num_computed_tokens
            end = start + n
            if len(table) * bs < end:
                raise AssertionError(f"{rid}: table of {len(table)} blocks for {end} tokens")
            prints = fingerprints(req.all_token_ids, end)
            for pos in range(start):
                got = self.gpu[table[pos // bs]][pos % bs]
                if got != prints[pos]:
                    raise AssertionError(
                        f"{rid}: KV at position {pos} (block {table[pos // bs]}) is stale"
                    )
        for rid, n in so.num_scheduled_tokens.items():
            req = so.requests[rid]
            table = so.block_tables[rid]
            start = req.num_computed_tokens
            # a draft's KV is that of the draft tokens, right or wrong
            tokens = req.all_token_ids + so.spec_token_ids.get(rid, [])
            prints = fingerprints(tokens, start + n)
            for pos in range(start, start + n):
                self.gpu[table[pos // bs]][pos % bs] = prints[pos]


class DraftingExecutor(DeterministicExecutor):
    """Also drafts: up to ``k`` tokens, of which a pseudo-random prefix is right (the tokens
    it will sample) and the rest wrong (token 1, which it never samples)."""

    def propose_draft(self, req: Request, k: int) -> list[int]:
        first = len(req.all_token_ids)
        length = 1 + hash((req.request_id, first, "length")) % k
        right = hash((req.request_id, first)) % (length + 1)
        draft = [token_for(req.parent_id, req.index, first + j) for j in range(right)]
        return draft + [1] * (length - right)


class PricedExecutor(DeterministicExecutor):
    """With a step-time model for adaptive chunking (as the simulator has): 1 ms + 0.5 ms
    a token (the steps themselves still report ``step_duration_s``)."""

    def step_time(self, d: int, ctx: int, p: int, prior: int = 0) -> float:
        return 0.001 + 5e-4 * (d + p)
