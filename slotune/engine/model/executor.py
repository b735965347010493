"""TorchExecutor: the real model behind the engine's Executor protocol."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slotune.engine.config import EngineConfig
from slotune.engine.executor import ExecutorOutput, KVCacheCapacity
from slotune.engine.kv_dtype import kv_block_bytes
from slotune.engine.model.attention import (
    BACKEND_NAMES,
    AttentionBackend,
    AttentionMetadata,
    select_backend,
)
from slotune.engine.model.draft import DraftModel
from slotune.engine.model.kv_cache import KVCache, allocate_kv_cache, cache_tensors
from slotune.engine.model.llama import ForwardBatch
from slotune.engine.model.loader import load_model
from slotune.engine.model.peaks import device_ceilings
from slotune.engine.model.sampler import Sampler, SampleRow
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.sim.batch import batch_totals, prefill_context_sum
from slotune.engine.spec_decode import verified

logger = logging.getLogger(__name__)

GIB = 1 << 30
CPU_KV_SHARE = 0.1  # of physical memory, times gpu_memory_utilization, when running on the CPU
CPU_KV_CAP_BYTES = 1 * GIB
ACTIVATION_RESERVE_BYTES = 256 << 20
SINGLE_THREAD_MAX_HIDDEN = 1024


class TorchExecutor:
    """Runs a local Hugging Face Llama-family checkpoint over a paged KV cache.

    The device cache is two tensors [layers, blocks, block_size, kv_heads, head_dim]
    (keys, values), or with a quantized ``kv_cache_dtype`` two ``QuantizedCache`` of codes
    and scales; swapped-out blocks live in a CPU pool of the same layout, pinned when the
    device is CUDA. ``attention`` is chosen when the cache is allocated, since the
    flash and triton backends depend on the block size.

    On the CPU, ``threads`` sets torch's intra-op threads for the process. By default a
    model of hidden size up to 1024 runs on one thread: its matrices are too small to gain
    from splitting, and spinning worker threads slow down many-fold when other processes
    share the cores. Larger models keep torch's default.

    ``timer`` times each step; ``time.process_time`` (with one thread, on the CPU) measures
    the step as if no other process shared the cores.

    With ``EngineConfig.speculative_model`` and ``num_speculative_tokens`` it loads the
    draft (``draft.DraftModel``) when the engine sizes the cache, counts its KV in every
    block, and hands it to the scheduler as ``propose_draft``; a step's duration then
    includes the drafting that the schedule before it ran.
    """

    def __init__(
        self,
        model_path: str | Path,
        device: str = "auto",
        attention: str = "auto",
        dtype: str = "auto",
        threads: int | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        if attention not in BACKEND_NAMES:
            raise ValueError(
                f"TorchExecutor: attention {attention!r} is unknown; choose one of {BACKEND_NAMES}"
            )
        loaded = load_model(model_path, device=device, dtype=dtype)
        self.model_path = loaded.path
        self.model = loaded.model
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = loaded.eos_token_ids
        self.eos_token_id: int | None = loaded.eos_token_ids[0] if loaded.eos_token_ids else None
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.attention_name = attention
        self.backend: AttentionBackend | None = None
        self.block_size = 0
        self.kv_capacity_bytes = 0
        self.sampler = Sampler()
        self.timer = timer
        self._kv: tuple[KVCache, KVCache] | None = None
        self._cpu_kv: tuple[KVCache, KVCache] | None = None
        self.propose_draft: DraftModel | None = None  # the draft model, when one drafts
        if self.device.type == "cpu":
            if threads is None and self.model_config.hidden_size <= SINGLE_THREAD_MAX_HIDDEN:
                threads = 1
            if threads:
                torch.set_num_threads(threads)

    def block_bytes(self, block_size: int, kv_cache_dtype: str = "auto") -> int:
        c = self.model_config
        per_layer = kv_block_bytes(
            kv_cache_dtype, block_size, c.num_key_value_heads, c.head_dim, self.dtype.itemsize
        )
        draft = self.propose_draft
        draft_bytes = draft.block_bytes(block_size, kv_cache_dtype) if draft else 0
        return c.num_hidden_layers * per_layer + draft_bytes

    def determine_capacity(self, config: EngineConfig) -> KVCacheCapacity:
        self._load_draft(config)
        block_bytes = self.block_bytes(config.block_size, config.kv_cache_dtype)
        useful = config.max_num_seqs * -(-config.max_model_len // config.block_size)
        gpu_blocks = min(self._device_kv_bytes(config) // block_bytes, useful)
        cpu_blocks = min(int(config.swap_space_gb * GIB) // block_bytes, useful)
        if gpu_blocks < 1:
            raise ValueError(
                f"EngineConfig.gpu_memory_utilization={config.gpu_memory_utilization} leaves no "
                f"room for the KV cache on {self.device}; raise it or set num_gpu_blocks"
            )
        return KVCacheCapacity(num_gpu_blocks=int(gpu_blocks), num_cpu_blocks=int(cpu_blocks))

    def _load_draft(self, config: EngineConfig) -> None:
        path = config.speculative_model
        if not path or not config.num_speculative_tokens:
            self.propose_draft = None
        elif self.propose_draft is None or self.propose_draft.path != Path(path):
            self.propose_draft = DraftModel(
                path, self.model_config, self.device, self.dtype, self.timer
            )

    def _device_kv_bytes(self, config: EngineConfig) -> int:
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = total * config.gpu_memory_utilization - (total - free)
            return int(budget - self._activation_bytes(config))
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return int(min(total * CPU_KV_SHARE, CPU_KV_CAP_BYTES) * config.gpu_memory_utilization)

    def _activation_bytes(self, config: EngineConfig) -> int:
        """A generous bound on one step's activations: the widest tensors of a full batch."""
        c = self.model_config
        width = 4 * c.hidden_size + 2 * c.intermediate_size
        width += (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        per_step = config.max_num_batched_tokens * width * self.dtype.itemsize
        logits = config.max_num_seqs * c.vocab_size * 4 * 3
        return per_step + logits + ACTIVATION_RESERVE_BYTES

    def initialize_cache(self, config: EngineConfig, capacity: KVCacheCapacity) -> None:
        c = self.model_config
        self.block_size = config.block_size
        self.kv_capacity_bytes = capacity.num_gpu_blocks * self.block_bytes(
            config.block_size, config.kv_cache_dtype
        )
        shape = (c.num_hidden_layers, 0, config.block_size, c.num_key_value_heads, c.head_dim)
        gpu_shape = (*shape[:1], capacity.num_gpu_blocks, *shape[2:])
        cpu_shape = (*shape[:1], capacity.num_cpu_blocks, *shape[2:])
        self.backend = select_backend(
            self.attention_name, self.device, config.block_size, self.dtype, config.kv_cache_dtype
        )
        # Zeroed: a padded decode batch multiplies masked-out slots by zero weights, and
        # uninitialised memory could hold NaN. Swapped-in blocks are copies of such blocks.
        kv_dtype = config.kv_cache_dtype
        self._kv = allocate_kv_cache(kv_dtype, gpu_shape, self.dtype, self.device)
        pin = self.device.type == "cuda"
        self._cpu_kv = allocate_kv_cache(
            kv_dtype, cpu_shape, self.dtype, "cpu", pin_memory=pin, zeroed=False
        )
        self._load_draft(config)
        if self.propose_draft is not None:
            self.propose_draft.initialize_cache(
                kv_dtype,
                config.block_size,
                capacity.num_gpu_blocks,
                capacity.num_cpu_blocks,
                self.backend,
            )
        logger.info(
            "KV cache: %d device blocks, %d CPU blocks of %d tokens (%s); attention: %s",
            capacity.num_gpu_blocks,
            capacity.num_cpu_blocks,
            config.block_size,
            kv_dtype,
            self.backend.name,
        )

    def hardware(self) -> dict[str, Any]:
        """What reads this engine's steps against its device (``sim.roofline``): the
        checkpoint's ``config.json``, the dtype it ran in, the device, its KV capacity and
        the ceilings (``peaks.device_ceilings``: the datasheet's, or measured here once per
        process). Call it outside a timed run: measuring takes a second."""
        return {
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "dtype_bytes": self.dtype.itemsize,
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "ceilings": device_ceilings(self.device, self.dtype),
            "model_config": json.loads((self.model_path / "config.json").read_text()),
        }

    def execute(self, scheduler_output: SchedulerOutput) -> ExecutorOutput:
        if self._kv is None or self.backend is None:
            raise RuntimeError("TorchExecutor.execute: call initialize_cache first")
        start = self.timer()
        for rid in scheduler_output.finished_request_ids:
            self.sampler.forget(rid)
        self._copy_blocks(scheduler_output)
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list[float]] = {}
        top_logprobs: dict[str, dict[int, float]] = {}
        if not scheduler_output.is_empty:
            batch, rows = self._prepare(scheduler_output)
            logits = self.model(batch, self._kv[0], self._kv[1], self.backend)
            if self.propose_draft is not None:
                self.propose_draft.catch_up(batch)
            spec = scheduler_output.spec_token_ids
            drawn = {r.request_id for r in rows if r.request_id in spec and not r.params.greedy}
            if drawn:  # sampled requests' drafts go through rejection sampling
                for rid in drawn:
                    at = [i for i, r in enumerate(rows) if r.request_id == rid]
                    result = self.sampler.speculative_sample(logits[at], spec[rid], rows[at[0]])
                    sampled[rid], logprobs[rid] = result.token_ids, result.logprobs
                keep = [i for i, r in enumerate(rows) if r.request_id not in drawn]
                rows, logits = [rows[i] for i in keep], logits[keep]
            for row, result in zip(rows, self.sampler.sample(logits, rows), strict=True):
                rid = row.request_id
                if spec and rid in spec:  # one row per position: collect, verify below
                    sampled.setdefault(rid, []).extend(result.token_ids)
                    logprobs.setdefault(rid, []).extend(result.logprobs)
                    continue
                sampled[rid] = result.token_ids
                logprobs[rid] = result.logprobs
                if result.top_logprobs is not None:
                    top_logprobs[rid] = result.top_logprobs
            for rid, draft in spec.items():
                if rid in drawn:
                    continue
                sampled[rid] = verified(draft, sampled[rid])
                logprobs[rid] = logprobs[rid][: len(sampled[rid])]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        duration = self.timer() - start
        if self.propose_draft is not None:
            duration += self.propose_draft.take_pending_seconds()
        requests = scheduler_output.requests
        _, decode_context, chunks = batch_totals(
            (n, requests[rid].num_computed_tokens)
            for rid, n in scheduler_output.num_scheduled_tokens.items()
        )
        return ExecutorOutput(
            sampled_token_ids=sampled,
            duration_s=duration,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            decode_context_sum=decode_context,
            prefill_context_sum=prefill_context_sum(chunks),
        )

    def _copy_blocks(self, so: SchedulerOutput) -> None:
        assert self._kv is not None and self._cpu_kv is not None
        device, host = list(self._kv), list(self._cpu_kv)
        draft = self.propose_draft
        if draft is not None and draft.kv is not None and draft.cpu_kv is not None:
            device += draft.kv  # the same block ids in the draft's own tensors
            host += draft.cpu_kv
        device_tensors = [t for cache in device for t in cache_tensors(cache)]
        host_tensors = [t for cache in host for t in cache_tensors(cache)]
        for gpu, cpu in zip(device_tensors, host_tensors, strict=True):
            if so.swap_out:
                src, dst = _pairs(so.swap_out, self.device, torch.device("cpu"))
                cpu[:, dst] = gpu[:, src].to("cpu")
            if so.swap_in:
                src, dst = _pairs(so.swap_in, torch.device("cpu"), self.device)
                gpu[:, dst] = cpu[:, src].to(self.device, non_blocking=True)
            if so.copy_on_write:
                src, dst = _pairs(so.copy_on_write, self.device, self.device)
                gpu[:, dst] = gpu[:, src]

    def _prepare(self, so: SchedulerOutput) -> tuple[ForwardBatch, list[SampleRow]]:
        """Flatten this step's tokens and build the varlen paged-attention metadata."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        tables: list[list[int]] = []
        logits_indices: list[int] = []
        rows: list[SampleRow] = []
        for rid, n in so.num_scheduled_tokens.items():
            if n <= 0:
                continue
            req = so.requests[rid]
            c = req.num_computed_tokens
            table = so.block_tables[rid]
            draft = so.spec_token_ids.get(rid)
            if draft:  # the last sampled token, then the draft: sample at each of them
                input_ids += req.all_token_ids[c:]
                input_ids += draft
                first = len(input_ids) - n
                logits_indices += range(first, len(input_ids))
                rows += [SampleRow(rid, req.sampling_params, 1)] * n
            else:
                input_ids += req.all_token_ids[c : c + n]
            positions += range(c, c + n)
            slots += [table[p // bs] * bs + p % bs for p in range(c, c + n)]
            query_lens.append(n)
            context_lens.append(c + n)
            tables.append(table)
            num_samples = so.num_samples.get(rid, 1 if c + n >= req.num_tokens else 0)
            if num_samples > 0 and not draft:
                logits_indices.append(len(input_ids) - 1)
                rows.append(SampleRow(rid, req.sampling_params, num_samples, req.index))
        if max(input_ids) >= self.model_config.vocab_size:
            self._reject_out_of_vocab(so)
        dev = self.device
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        cu_q = _cumsum(query_lens)
        cu_k = _cumsum(context_lens)
        meta = AttentionMetadata(
            cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=dev),
            cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=dev),
            seq_lens_k=torch.tensor(context_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            max_seqlen_q=max(query_lens),
            max_seqlen_k=max(context_lens),
            query_lens=tuple(query_lens),
            context_lens=tuple(context_lens),
        )
        batch = ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            attention=meta,
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=dev),
        )
        return batch, rows

    def _reject_out_of_vocab(self, so: SchedulerOutput) -> None:
        vocab = self.model_config.vocab_size
        for rid in so.num_scheduled_tokens:
            worst = max(so.requests[rid].all_token_ids)
            if worst >= vocab:
                raise ValueError(
                    f"request {rid!r}: token id {worst} is outside the model's vocabulary of "
                    f"{vocab}; tokenize prompts with the model's tokenizer"
                )


def _cumsum(values: list[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _pairs(
    pairs: list[tuple[int, int]], src_device: torch.device, dst_device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([s for s, _ in pairs], dtype=torch.int64, device=src_device)
    dst = torch.tensor([d for _, d in pairs], dtype=torch.int64, device=dst_device)
    return src, dst
