"""The simulated executor: a cost-model duration and deterministic tokens for each step."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from slotune.engine.config import EngineConfig
from slotune.engine.executor import ExecutorOutput, KVCacheCapacity
from slotune.engine.request import Request
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.sim.capacity import determine_capacity
from slotune.engine.sim.cost_model import CostModel
from slotune.engine.sim.models import ModelSpec, get_model
from slotune.engine.sim.profile import GpuProfile, load_profile

_MASK = 0xFFFFFFFF
_TOKEN_LOW = 100  # below this lie the special tokens of every catalogue tokenizer
_TOKEN_HIGH = 32000  # all catalogue vocabularies have regular tokens up to here
_VECTOR_MIN = 256  # fewer tokens than this are hashed faster one by one


class SimExecutor:
    """Executes a ``SchedulerOutput`` on a named GPU and model, on a virtual clock.

    Sampled tokens are a hash of (request id, position, sample index) into the regular
    vocabulary, never an end-of-sequence or stop token, so simulated requests end by
    ``max_tokens``. ``gpu`` is a catalogue name or the path of a profile JSON; ``model`` a
    catalogue name or the path of an HF ``config.json``.
    """

    def __init__(self, gpu: str = "h100", model: str = "llama-3-8b", tp: int = 1) -> None:
        self.profile: GpuProfile = load_profile(gpu)
        self.model: ModelSpec = get_model(model)
        self.model.check_tp(tp)
        self.tp = tp
        self.cost_model = CostModel(self.profile, self.model, tp)
        self.capacity: KVCacheCapacity | None = None
        hi = min(self.model.vocab_size, _TOKEN_HIGH)
        self._token_low = min(_TOKEN_LOW, hi // 2)
        self._token_span = hi - self._token_low
        self._avoid = frozenset(self.model.eos_token_ids)
        self._seeds: dict[str, tuple[int, frozenset[int] | None]] = {}

    # -- Executor protocol -------------------------------------------------------------
    def determine_capacity(self, config: EngineConfig) -> KVCacheCapacity:
        return determine_capacity(self.profile, self.model, self.tp, config)

    def initialize_cache(self, config: EngineConfig, capacity: KVCacheCapacity) -> None:
        self.cost_model = CostModel(self.profile, self.model, self.tp, config.block_size)
        self.capacity = capacity

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        so = scheduler_output
        requests, samples, seeds = so.requests, so.num_samples, self._seeds
        low, span = self._token_low, self._token_span
        num_decodes = context_sum = 0
        chunks: list[tuple[int, int]] = []
        sampled: dict[str, list[int]] = {}
        for rid, n in so.num_scheduled_tokens.items():
            req = requests[rid]
            prior = req.num_computed_tokens
            if n == 1:
                num_decodes += 1
                context_sum += prior + 1
            else:
                chunks.append((n, prior))
            k = samples.get(rid)
            if not k:
                continue
            if k > 1:
                sampled[rid] = [self._token(req, prior + n, i) for i in range(k)]
                continue
            entry = seeds.get(rid)
            if entry is None:
                entry = seeds[rid] = self._seed(req)
            x = (entry[0] + (prior + n) * 0x85EBCA77) & _MASK  # _token, inlined for speed
            x ^= x >> 15
            x = (x * 0x2C1B3C6D) & _MASK
            x ^= x >> 12
            token = low + x % span
            avoid = entry[1]
            if avoid is not None and token in avoid:
                token = self._token(req, prior + n, 0)
            sampled[rid] = [token]
        duration = self.cost_model.step_seconds(
            so.total_num_scheduled_tokens,
            len(samples),
            len(so.num_scheduled_tokens),
            num_decodes,
            context_sum,
            chunks,
            len(so.swap_out) + len(so.swap_in),
            len(so.copy_on_write),
        )
        for rid in so.finished_request_ids:
            seeds.pop(rid, None)
        return ExecutorOutput(sampled_token_ids=sampled, duration_s=duration)

    # -- for the engine's decode fast-forward ---------------------------------------------
    def decode_stretch_durations(
        self, context_lens: Sequence[int] | int, k: int, context_sum: int | None = None
    ) -> list[float]:
        """See ``CostModel.decode_stretch_durations``: equal to ``execute`` step by step."""
        return self.cost_model.decode_stretch_durations(context_lens, k, context_sum)

    def planned_step_seconds(
        self,
        num_tokens: int,
        num_samples: int,
        num_requests: int,
        num_decodes: int,
        context_sum: int,
        chunks: Sequence[tuple[int, int]],
    ) -> float:
        """The duration ``execute`` finds for a step without block copies that schedules
        ``num_tokens`` for ``num_requests`` requests (``num_decodes`` of one token reading
        ``context_sum`` KV tokens together, ``chunks`` as ``(tokens, prior context)`` in
        batch order) and samples ``num_samples``: the same arithmetic, to the bit."""
        return self.cost_model.step_seconds(
            num_tokens, num_samples, num_requests, num_decodes, context_sum, chunks, 0, 0
        )

    def sampled_token(self, request: Request, position: int, index: int = 0) -> int:
        """The token ``execute`` samples for ``request`` at ``position`` (its index in the
        request's token list once appended); ``index`` tells samples of ``n > 1`` apart."""
        return self._token(request, position, index)

    def sampled_tokens(self, request: Request, first_position: int, k: int) -> list[int]:
        """The tokens ``execute`` samples for ``request`` at ``k`` consecutive positions
        (one decode each), in one call: what a decode fast-forward appends."""
        entry = self._seeds.get(request.request_id)
        if entry is None:
            entry = self._seeds[request.request_id] = self._seed(request)
        seed, avoid = entry
        low, span = self._token_low, self._token_span
        out = []
        for position in range(first_position, first_position + k):
            x = (seed + position * 0x85EBCA77) & _MASK
            x ^= x >> 15
            x = (x * 0x2C1B3C6D) & _MASK
            x ^= x >> 12
            token = low + x % span
            if avoid is not None and token in avoid:
                token = self._token(request, position, 0)
            out.append(token)
        return out

    def sampled_token_runs(
        self, requests: Sequence[Request], first_positions: Sequence[int], counts: Sequence[int]
    ) -> list[list[int]]:
        """``sampled_tokens`` of many requests at once (vectorized when there are many):
        what a fast-forwarded stretch appends."""
        total = sum(counts)
        if total < _VECTOR_MIN:
            return [
                self.sampled_tokens(r, p, k)
                for r, p, k in zip(requests, first_positions, counts, strict=True)
            ]
        import numpy as np

        seeds = self._seeds
        entries = []
        for r in requests:
            entry = seeds.get(r.request_id)
            if entry is None:
                entry = seeds[r.request_id] = self._seed(r)
            entries.append(entry)
        reps = np.asarray(counts, dtype=np.int64)
        ends = np.cumsum(reps)
        starts = ends - reps
        seed = np.repeat(np.array([e[0] for e in entries], dtype=np.uint64), reps)
        offset = np.repeat(np.asarray(first_positions, dtype=np.int64) - starts, reps)
        position = (offset + np.arange(total, dtype=np.int64)).astype(np.uint64)
        x = (seed + position * np.uint64(0x85EBCA77)) & np.uint64(_MASK)
        x ^= x >> np.uint64(15)
        x = (x * np.uint64(0x2C1B3C6D)) & np.uint64(_MASK)
        x ^= x >> np.uint64(12)
        flat = (x % np.uint64(self._token_span) + np.uint64(self._token_low)).tolist()
        out = [flat[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        for r, (_, avoid), toks, first in zip(requests, entries, out, first_positions, strict=True):
            if avoid is not None and not avoid.isdisjoint(toks):
                toks[:] = self.sampled_tokens(r, first, len(toks))
        return out

    def _seed(self, req: Request) -> tuple[int, frozenset[int] | None]:
        """The request's hash seed and the tokens it must never sample (None: none can be
        drawn anyway)."""
        seed = (zlib.crc32(req.request_id.encode()) * 0x9E3779B1) & _MASK
        avoid = set(self._avoid) | set(req.sampling_params.stop_token_ids)
        if req.eos_token_id is not None:
            avoid.add(req.eos_token_id)
        low, high = self._token_low, self._token_low + self._token_span
        drawable = frozenset(t for t in avoid if low <= t < high)
        return seed, drawable or None

    def _token(self, req: Request, position: int, index: int) -> int:
        entry = self._seeds.get(req.request_id)
        if entry is None:
            entry = self._seeds[req.request_id] = self._seed(req)
        seed, avoid = entry
        x = (seed + position * 0x85EBCA77 + index * 0xC2B2AE3D) & _MASK
        x ^= x >> 15
        x = (x * 0x2C1B3C6D) & _MASK
        x ^= x >> 12
        token = self._token_low + x % self._token_span
        while avoid is not None and token in avoid:
            token = self._token_low + (token - self._token_low + 1) % self._token_span
        return token
