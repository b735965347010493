"""The simulated executor: a cost-model duration and deterministic tokens for each step."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence

from slotune.engine.config import EngineConfig
from slotune.engine.executor import ExecutorOutput, KVCacheCapacity
from slotune.engine.request import Request
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.sim.batch import batch_totals, prefill_context_sum
from slotune.engine.sim.capacity import determine_capacity
from slotune.engine.sim.cost_model import CostModel
from slotune.engine.sim.models import ModelSpec, get_model
from slotune.engine.sim.profile import GpuProfile, load_profile
from slotune.engine.sim.speculative import (
    catch_up_seconds,
    check_acceptance,
    default_acceptance,
    draft_seconds,
    draw_accepted,
)
from slotune.engine.sim.stack import StackProfile, load_stack

_MASK = 0xFFFFFFFF
_TOKEN_LOW = 100  # below this lie the special tokens of every catalogue tokenizer
_TOKEN_HIGH = 32000  # all catalogue vocabularies have regular tokens up to here
_TABLE_MASK = (1 << 15) - 1  # the token table holds 32,768 tokens
_INDEX_STRIDE = 4099  # how far apart in the table the samples of an n > 1 prompt lie
_TABLES: dict[tuple[int, int], list[int]] = {}


class SimExecutor:
    """Executes a ``SchedulerOutput`` on a named GPU and model, on a virtual clock.

    Sampled tokens are a function of (request id, position, sample index) into the regular
    vocabulary (a table of pseudo-random tokens, read from an offset hashed from the id),
    never an end-of-sequence or stop token, so simulated requests end by ``max_tokens``
    (unless a request's stop tokens cover every token it could draw: then its first token
    stops it, rather than the draw looping forever).
    ``gpu`` is a catalogue name, the path of a profile JSON or a ``GpuProfile``; ``model`` a
    catalogue name or the path of an HF ``config.json``; ``stack`` the serving engine
    around the kernels (a shipped stack name, a stack JSON path or a ``StackProfile``;
    default: current vLLM V1); ``quantization`` overrides the model's weight format;
    ``ep`` of the ``tp`` GPUs split a MoE model's experts.

    With speculation on (``EngineConfig.num_speculative_tokens``) it drafts the tokens it
    will sample and accepts each with probability ``spec_acceptance`` given the ones before
    (``slotune.engine.sim.speculative``), drawn from a generator seeded with ``spec_seed``:
    outputs are those without speculation, only the steps and their costs change.
    ``spec_draft_model`` (a catalogue name or config.json; default
    ``EngineConfig.speculative_model``) prices the drafts as that model's passes on the
    same GPUs (``speculative``), its weights and KV taken from the pool; without one they
    are free (n-gram). ``spec_acceptance`` defaults to ``EngineConfig.speculative_acceptance``,
    else to the measured rate of the kind (``speculative.DRAFT_ACCEPTANCE`` or
    ``NGRAM_ACCEPTANCE``).
    """

    def __init__(
        self,
        gpu: str | GpuProfile = "h100",
        model: str = "llama-3-8b",
        tp: int = 1,
        stack: str | StackProfile | None = None,
        *,
        quantization: str | None = None,
        ep: int = 1,
        spec_acceptance: float | None = None,
        spec_seed: int = 0,
        spec_draft_model: str | None = None,
    ) -> None:
        self._acceptance = None if spec_acceptance is None else check_acceptance(spec_acceptance)
        self._spec_rng = random.Random(spec_seed)
        self._draft_name = spec_draft_model
        self.draft_model = None if spec_draft_model is None else get_model(spec_draft_model)
        self.spec_acceptance = default_acceptance(self.draft_model is not None)
        if self._acceptance is not None:
            self.spec_acceptance = self._acceptance
        self.draft_cost: CostModel | None = None
        self.profile: GpuProfile = gpu if isinstance(gpu, GpuProfile) else load_profile(gpu)
        self.model: ModelSpec = get_model(model, quantization)
        self.model.check_tp(tp)
        self.model.check_ep(tp, ep)
        self.tp, self.ep = tp, ep
        if stack is None and self.profile.stack:
            stack = self.profile.stack  # a profile measured through an engine prices its steps
        self.stack = stack if isinstance(stack, StackProfile) else load_stack(stack)
        self.cost_model = CostModel(self.profile, self.model, tp, stack=self.stack, ep=ep)
        self.capacity: KVCacheCapacity | None = None
        hi = min(self.model.vocab_size, _TOKEN_HIGH)
        self._token_low = min(_TOKEN_LOW, hi // 2)
        self._token_span = hi - self._token_low
        self._avoid = frozenset(self.model.eos_token_ids)
        self._seeds: dict[str, tuple[int, frozenset[int] | None]] = {}
        self._table = _token_table(self._token_low, self._token_span)

    # -- Executor protocol -------------------------------------------------------------
    def determine_capacity(self, config: EngineConfig) -> KVCacheCapacity:
        self._choose_draft(config)
        return determine_capacity(self.profile, self.model, self.tp, config, self.draft_model)

    def _choose_draft(self, config: EngineConfig) -> None:
        """The draft model that prices this configuration's drafts: ``spec_draft_model``,
        else ``config.speculative_model``; none without speculation."""
        name = self._draft_name or config.speculative_model
        drafting = bool(name and config.num_speculative_tokens)
        self.draft_model = get_model(name) if drafting and name else None
        alpha = self._acceptance
        if alpha is None:
            alpha = config.speculative_acceptance
        if alpha is None:
            alpha = default_acceptance(self.draft_model is not None)
        self.spec_acceptance = alpha

    def initialize_cache(self, config: EngineConfig, capacity: KVCacheCapacity) -> None:
        self.cost_model = CostModel(
            self.profile,
            self.model,
            self.tp,
            config.block_size,
            self.stack,
            config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            ep=self.ep,
            kv_cache_dtype=config.kv_cache_dtype,
        )
        self.capacity = capacity
        self._choose_draft(config)
        self.draft_cost = None
        if self.draft_model is not None:
            self.draft_cost = CostModel(
                self.profile, self.draft_model, self.tp, config.block_size, self.stack
            )

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        so = scheduler_output
        requests, samples, seeds = so.requests, so.num_samples, self._seeds
        table = self._table
        scheduled = so.num_scheduled_tokens
        spec = so.spec_token_ids
        num_decodes, context_sum, chunks = batch_totals(
            [
                (n, requests[rid].num_computed_tokens)
                for rid, n in scheduled.items()
                if not spec or rid not in spec
            ]
        )
        sampled: dict[str, list[int]] = {}
        num_rows = len(samples)  # logits rows: one per sample, k + 1 per verifying request
        draft_context = 0
        for rid in spec:  # k + 1 query tokens over one read of the context
            req, n = requests[rid], scheduled[rid]
            num_decodes += 1
            context_sum += req.num_computed_tokens + n
            draft_context += req.num_computed_tokens + 1
            num_rows += n - 1
            accepted = draw_accepted(self._spec_rng, self.spec_acceptance, len(spec[rid]))
            sampled[rid] = self.sampled_tokens(req, len(req.all_token_ids), accepted + 1)
        for rid, n in scheduled.items():
            if spec and rid in spec:
                continue
            k = samples.get(rid)
            if not k:
                continue
            req = requests[rid]
            prior = req.num_computed_tokens
            if k > 1:
                sampled[rid] = [self._token(req, prior + n, i) for i in range(k)]
                continue
            entry = seeds.get(rid)
            if entry is None:
                entry = seeds[rid] = self._seed(req)
            token = table[(entry[0] + prior + n) & _TABLE_MASK]  # _token, inlined for speed
            avoid = entry[1]
            if avoid is not None and token in avoid:
                token = self._token(req, prior + n, 0)
            sampled[rid] = [token]
        duration = self.cost_model.step_seconds(
            so.total_num_scheduled_tokens,
            num_rows,
            len(so.num_scheduled_tokens),
            num_decodes,
            context_sum,
            chunks,
            len(so.swap_out) + len(so.swap_in),
            len(so.copy_on_write),
        )
        if self.draft_cost is not None and scheduled:  # the draft's pass over the step
            duration += catch_up_seconds(
                self.draft_cost, so.total_num_scheduled_tokens, num_decodes, context_sum, chunks
            )
        if spec and self.draft_cost is not None:
            depth = max(len(d) for d in spec.values())  # the draft model runs this many steps
            duration += draft_seconds(self.draft_cost, len(spec), draft_context, depth)
        for rid in so.finished_request_ids:
            seeds.pop(rid, None)
        return ExecutorOutput(
            sampled,
            duration,
            decode_context_sum=context_sum,
            prefill_context_sum=prefill_context_sum(chunks),
        )

    # -- for the engine's stretches (``Engine.run_stretch``) ---------------------------
    @property
    def planned_step_seconds(self) -> Callable[..., float]:
        """The duration ``execute`` finds for a step without block copies, called as
        ``(num_tokens, num_samples, num_requests, num_decodes, context_sum, chunks)``: a step
        that schedules ``num_tokens`` for ``num_requests`` requests (``num_decodes`` of one
        token reading ``context_sum`` KV tokens together, ``chunks`` as ``(tokens, prior
        context)`` in batch order) and samples ``num_samples``. It is the cost model's
        ``step_seconds`` itself (no swaps, no copies: the same arithmetic, to the bit),
        handed out once per stretch so that a step costs no extra call."""
        return self.cost_model.step_seconds

    def step_time(
        self, num_decodes: int, context_sum: int, prefill_tokens: int, prefill_prior: int = 0
    ) -> float:
        """Adaptive chunking's step-time model (``slotune.engine.chunking.StepTime``): the
        cost model's step of ``num_decodes`` decodes reading ``context_sum`` KV tokens and
        one prefill chunk of ``prefill_tokens`` after ``prefill_prior`` tokens."""
        rows = num_decodes + (1 if prefill_tokens else 0)
        chunks = ((prefill_tokens, prefill_prior),) if prefill_tokens else ()
        return self.cost_model.step_seconds(
            num_decodes + prefill_tokens, rows, rows, num_decodes, context_sum, chunks
        )

    def propose_draft(self, request: Request, k: int) -> list[int]:
        """A draft of ``k`` tokens: the ones it will sample (rejections are drawn in
        ``execute``, so whatever it accepts, a request's tokens stay the same)."""
        return self.sampled_tokens(request, len(request.all_token_ids), k)

    def sampled_token(self, request: Request, position: int, index: int = 0) -> int:
        """The token ``execute`` samples for ``request`` at ``position`` (its index in the
        request's token list once appended); ``index`` tells samples of ``n > 1`` apart."""
        return self._token(request, position, index)

    def sampled_tokens(self, request: Request, first_position: int, k: int) -> list[int]:
        """The tokens ``execute`` samples for ``request`` at ``k`` consecutive positions
        (one decode each), in one call: a slice of the token table."""
        entry = self._seeds.get(request.request_id)
        if entry is None:
            entry = self._seeds[request.request_id] = self._seed(request)
        offset, avoid = entry
        table = self._table
        start = (offset + first_position) & _TABLE_MASK
        out = table[start : start + k]
        while len(out) < k:  # wrapped around the table's end
            out += table[: k - len(out)]
        if avoid is not None and not avoid.isdisjoint(out):
            out = [
                self._token(request, p, 0) if t in avoid else t
                for p, t in enumerate(out, first_position)
            ]
        return out

    def sampled_token_runs(
        self, requests: Sequence[Request], counts: Sequence[int]
    ) -> list[list[int]]:
        """For each request, the ``count`` tokens ``execute`` samples next (from position
        ``len(request.all_token_ids)`` on; ``[]`` for a count of 0): what a
        stretch appends. ``sampled_tokens`` of each, in one call."""
        seeds, table = self._seeds, self._table
        runs: list[list[int]] = []
        for req, k in zip(requests, counts, strict=True):
            if not k:
                runs.append([])
                continue
            entry = seeds.get(req.request_id)
            if entry is None or entry[1] is not None or k > _TABLE_MASK:
                runs.append(self.sampled_tokens(req, len(req.all_token_ids), k))
                continue
            start = (entry[0] + len(req.all_token_ids)) & _TABLE_MASK
            run = table[start : start + k]
            if len(run) < k:  # wrapped around the table's end
                run += table[: k - len(run)]
            runs.append(run)
        return runs

    def _seed(self, req: Request) -> tuple[int, frozenset[int] | None]:
        """The request's offset into the token table and the tokens it must never sample
        (None: none of them can be drawn, or all that can be are, and it stops at once)."""
        offset = (zlib.crc32(req.request_id.encode()) * 0x9E3779B1) & _MASK
        avoid = set(self._avoid) | set(req.sampling_params.stop_token_ids)
        if req.eos_token_id is not None:
            avoid.add(req.eos_token_id)
        low, high = self._token_low, self._token_low + self._token_span
        drawable = frozenset(t for t in avoid if low <= t < high)
        if len(drawable) >= self._token_span:  # every token it could draw stops it:
            return offset, None  # draw as usual, so its first token stops it
        return offset, drawable or None

    def _token(self, req: Request, position: int, index: int) -> int:
        entry = self._seeds.get(req.request_id)
        if entry is None:
            entry = self._seeds[req.request_id] = self._seed(req)
        offset, avoid = entry
        token = self._table[(offset + position + index * _INDEX_STRIDE) & _TABLE_MASK]
        while avoid is not None and token in avoid:
            token = self._token_low + (token - self._token_low + 1) % self._token_span
        return token


def _token_table(low: int, span: int) -> list[int]:
    """Pseudo-random tokens in ``[low, low + span)``: a request's tokens are a window of
    this table starting at an offset hashed from its id, so a run of them is one slice."""
    key = (low, span)
    table = _TABLES.get(key)
    if table is None:
        table = []
        for i in range(_TABLE_MASK + 1):
            x = (i * 0x85EBCA77 + 0x165667B1) & _MASK
            x ^= x >> 15
            x = (x * 0x2C1B3C6D) & _MASK
            x ^= x >> 12
            table.append(low + x % span)
        _TABLES[key] = table
    return table
