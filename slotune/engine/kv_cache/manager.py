"""The KV-cache manager: block tables per request, prefix-cache hits, forks and swapping.

The scheduler asks it for slots before it schedules tokens (``allocate_slots``) and tells
it which requests filled blocks (``uncommitted``). Those blocks enter the prefix cache
lazily, in one batch before the next prefix lookup or when the request lets its blocks
go: no lookup can tell the difference, and a decode step pays one dict write instead of a
hash per filled block.

Block copies a step needs (copy-on-write here, swap lists from ``swap_out``/``swap_in``)
are handed back to the scheduler, which lists them in its output for the executor.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from slotune.engine.kv_cache.block_pool import BlockPool, KVCacheBlock
from slotune.engine.kv_cache.hash_cache import HashPrefixCache
from slotune.engine.kv_cache.prefix_cache import PrefixCache
from slotune.engine.kv_cache.radix_cache import RadixPrefixCache
from slotune.engine.request import Request
from slotune.engine.rules import blocks_for, swap_in_blocks

BlockCopy = tuple[int, int]


def make_prefix_cache(kind: str, block_size: int) -> PrefixCache[Any] | None:
    """The prefix cache ``prefix_caching`` names: ``none``, ``hash`` or ``radix``."""
    if kind == "none":
        return None
    if kind == "hash":
        return HashPrefixCache(block_size)
    if kind == "radix":
        return RadixPrefixCache(block_size)
    raise ValueError(f"prefix_caching: must be one of ('none', 'hash', 'radix') (got {kind!r})")


class RequestBlocks:
    """One request's GPU blocks. ``block_ids`` is the live table executors read;
    ``cache_state`` is the prefix cache's own record of the request (None without one)."""

    __slots__ = ("block_ids", "blocks", "cache_state", "num_slots")

    def __init__(self, blocks: list[KVCacheBlock], cache_state: object, block_size: int) -> None:
        self.blocks = blocks
        self.block_ids = [b.block_id for b in blocks]
        self.num_slots = len(blocks) * block_size
        self.cache_state = cache_state


@dataclass(frozen=True, slots=True)
class ComputedBlocks:
    """A prefix-cache hit found for a waiting request, adopted by ``allocate_slots``."""

    blocks: list[KVCacheBlock]
    num_tokens: int
    num_query_tokens: int
    cache_state: object


class KVCacheManager:
    """``lower_tier_blocks`` (None: no tiers) caps the distinct GPU blocks that requests of
    tier 1 and up hold together: an allocation, swap-in or prefix hit that would take
    them past it fails as if the pool were full. Forks add no distinct block."""

    def __init__(
        self,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        prefix_caching: str,
        lower_tier_blocks: int | None = None,
    ) -> None:
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.lower_tier_blocks = lower_tier_blocks
        self.lower_held: Counter[int] = Counter()  # block id -> lower-tier holders
        self.cache: PrefixCache[Any] | None = make_prefix_cache(prefix_caching, block_size)
        self.pool = BlockPool(num_gpu_blocks, self.cache)
        self.num_cpu_blocks = num_cpu_blocks
        self._free_cpu: list[int] = list(range(num_cpu_blocks - 1, -1, -1))
        self.req_blocks: dict[str, RequestBlocks] = {}
        self.block_tables: dict[str, list[int]] = {}  # live: rid -> req_blocks[rid].block_ids
        self.swapped: dict[str, list[int]] = {}
        self.uncommitted: dict[str, Request] = {}  # filled blocks not yet in the prefix cache
        self.cow_pending: set[str] = set()  # forks whose next write may hit a shared block
        self.pending_copy_on_write: list[BlockCopy] = []
        self.prefix_cache_queries_tokens = 0
        self.prefix_cache_hit_tokens = 0
        self.num_copy_on_write = 0

    # -- queries -------------------------------------------------------------------------

    @property
    def num_gpu_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._free_cpu)

    @property
    def usage(self) -> float:
        return self.pool.num_used_blocks / self.pool.num_blocks

    @property
    def num_lower_tier_blocks(self) -> int:
        """The distinct GPU blocks requests of tier 1 and up hold."""
        return len(self.lower_held)

    def _lower_room(self, request: Request, blocks: int) -> bool:
        """Whether ``blocks`` more distinct blocks for ``request`` stay within the cap."""
        cap = self.lower_tier_blocks
        return cap is None or not request.tier or len(self.lower_held) + blocks <= cap

    def _hold(self, request: Request, blocks: list[KVCacheBlock], sign: int = 1) -> None:
        """Count ``blocks`` as held (``sign`` 1) or let go (-1) by a lower-tier request."""
        if self.lower_tier_blocks is None or not request.tier:
            return
        held = self.lower_held
        for b in blocks:
            bid = b.block_id
            held[bid] += sign
            if not held[bid]:
                del held[bid]

    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def block_ids(self, request_id: str) -> list[int]:
        return self.req_blocks[request_id].block_ids

    def num_slots(self, request_id: str) -> int:
        """Token slots the request's GPU blocks hold."""
        return self.req_blocks[request_id].num_slots

    def blocks_held_alone(self, request_id: str) -> tuple[int, int]:
        """How many of the request's GPU blocks no one else holds, and how many it holds:
        what freeing it gives back, and whether that is all of them."""
        refs = [b.ref_cnt for b in self.req_blocks[request_id].blocks]
        return refs.count(1), len(refs)

    def swap_in_blocks(self, request: Request, num_new_tokens: int) -> int:
        """The GPU blocks ``swap_in(request, num_new_tokens)`` takes."""
        return swap_in_blocks(
            request.num_computed_tokens + num_new_tokens,
            len(self.swapped[request.request_id]),
            self.block_size,
        )

    # -- allocation ----------------------------------------------------------------------

    def get_computed_blocks(self, request: Request) -> ComputedBlocks | None:
        """The longest cached prefix of full blocks, leaving at least the last token to compute."""
        cache = self.cache
        if cache is None:
            return None
        if self.uncommitted:
            self.commit_all()
        blocks, state = self._match(cache, request)
        return ComputedBlocks(blocks, len(blocks) * self.block_size, request.num_tokens, state)

    def _match(self, cache: PrefixCache[Any], request: Request) -> tuple[list[KVCacheBlock], Any]:
        max_blocks = (request.num_tokens - 1) // self.block_size
        return cache.match(request.all_token_ids, max_blocks)

    def hit_lifetimes(self, request: Request) -> list[int] | None:
        """How long the hit a lookup of ``request`` (a waiting request without blocks)
        finds now lasts while allocations go on and no one commits into its chain: entry
        ``i`` is how many blocks the pool may hand out before the hit is shorter than
        ``i + 1`` blocks (the pool hands out the front of its free queue first, and a block
        handed out leaves the cache). Blocks not committed yet are not looked at (the
        caller knows none extends the hit). None when a hit block is held (not free), or
        for a cache that keeps blocks outside the free queue (a tree)."""
        cache = self.cache
        if cache is None:
            return []
        if not isinstance(cache, HashPrefixCache):
            return None
        blocks, _ = self._match(cache, request)
        positions = self.pool.free_queue.positions(blocks)
        return None if positions is None else list(accumulate(positions, min))

    def admission_takes(self, num_tokens: int, num_hit: int, num_free_hit: int) -> int:
        """The free blocks admitting a request without blocks takes for room for
        ``num_tokens`` tokens (its hit's included), when its prefix-cache hit is
        ``num_hit`` blocks, ``num_free_hit`` of them free: new blocks, and the free hit
        blocks it takes out of the free queue. ``allocate_slots`` fails when that is more
        than the free blocks."""
        return self.blocks_needed(num_tokens) - num_hit + num_free_hit

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed: ComputedBlocks | None = None
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``request``; False if the pool can't.

        A request without blocks yet adopts ``computed`` (its prefix-cache hit) first. The
        first write into a block shared with a fork is redirected to a copy (copy-on-write).
        On False nothing has changed.
        """
        rid = request.request_id
        rb = self.req_blocks.get(rid)
        needed = request.num_computed_tokens + num_new_tokens
        check_cow = bool(self.cow_pending) and rid in self.cow_pending
        if rb is not None:
            if needed <= rb.num_slots and not check_cow:
                return True
            held = len(rb.blocks)
            hit: list[KVCacheBlock] = []
        else:
            held = 0
            hit = computed.blocks if computed is not None else []
            if computed is not None:
                needed += computed.num_tokens
        num_new = self.blocks_needed(needed) - held - len(hit)
        cow = check_cow and self._needs_cow(rb, request.num_computed_tokens)
        pool = self.pool
        reusable = [b.ref_cnt for b in hit].count(0)
        if num_new + cow > pool.num_free_blocks - reusable:
            return False
        if self.lower_tier_blocks is not None and request.tier:
            adopted = sum(1 for b in hit if b.block_id not in self.lower_held)
            if not self._lower_room(request, num_new + cow + adopted):
                return False
        if rb is None:
            pool.touch(hit)
            state = computed.cache_state if computed is not None else self._new_cache_state()
            rb = RequestBlocks(list(hit), state, self.block_size)
            self._hold(request, hit)
            self.req_blocks[rid] = rb
            self.block_tables[rid] = rb.block_ids
            if computed is not None:
                self.prefix_cache_queries_tokens += computed.num_query_tokens
                self.prefix_cache_hit_tokens += computed.num_tokens
        if check_cow:
            self.cow_pending.discard(rid)
            if cow:
                self._copy_on_write(request, rb, request.num_computed_tokens // self.block_size)
        if num_new > 0:
            new = pool.get_new_blocks(num_new)
            if self.lower_tier_blocks is not None:
                self._hold(request, new)
            rb.blocks.extend(new)
            rb.block_ids.extend([b.block_id for b in new])
            rb.num_slots = len(rb.blocks) * self.block_size
        return True

    def rollback(self, request: Request) -> None:
        """Free the request's blocks past its computed tokens (those of rejected draft
        tokens): blocks that hold no verified token, tail first."""
        rb = self.req_blocks[request.request_id]
        keep = max(self.blocks_needed(request.num_computed_tokens), 1)
        if len(rb.blocks) > keep:
            dropped = rb.blocks[: keep - 1 : -1]
            self._hold(request, dropped, -1)
            self.pool.free_blocks(dropped)
            del rb.blocks[keep:]
            del rb.block_ids[keep:]
            rb.num_slots = keep * self.block_size

    def grow(self, allocations: list[tuple[str, int]]) -> None:
        """New blocks for requests, ``(request id, blocks)`` in order, taken exactly as
        that many ``allocate_slots`` calls would take them (the caller checked they fit).
        Only the stretch planner calls it, and it plans for no tiers."""
        if self.lower_tier_blocks is not None:
            raise RuntimeError("KVCacheManager.grow: not for tiers (the planner refuses them)")
        pool = self.pool
        total = sum([n for _, n in allocations])
        if total <= pool.free_queue.num_free_blocks:
            new = pool.get_new_blocks(total)
        else:  # a tree evicts, one allocation at a time as single steps do
            new = [b for _, n in allocations for b in pool.get_new_blocks(n)]
        new_ids = [b.block_id for b in new]
        req_blocks = self.req_blocks
        bs = self.block_size
        start = 0
        for rid, n in allocations:
            rb = req_blocks[rid]
            end = start + n
            rb.blocks += new[start:end]
            rb.block_ids += new_ids[start:end]
            rb.num_slots += n * bs
            start = end

    def _new_cache_state(self) -> object:
        return self.cache.new_state() if self.cache is not None else None

    def _needs_cow(self, rb: RequestBlocks | None, num_computed: int) -> int:
        if rb is None or num_computed % self.block_size == 0:
            return 0
        index = num_computed // self.block_size
        return int(index < len(rb.blocks) and rb.blocks[index].ref_cnt > 1)

    def _copy_on_write(self, request: Request, rb: RequestBlocks, index: int) -> None:
        src = rb.blocks[index]
        (dst,) = self.pool.get_new_blocks(1)
        self._hold(request, [src], -1)
        self._hold(request, [dst])
        self.pool.free_blocks([src])
        rb.blocks[index] = dst
        rb.block_ids[index] = dst.block_id
        self.pending_copy_on_write.append((src.block_id, dst.block_id))
        self.num_copy_on_write += 1

    def take_copy_on_write(self) -> list[BlockCopy]:
        copies = self.pending_copy_on_write
        self.pending_copy_on_write = []
        return copies

    def commit_all(self) -> None:
        for request in self.uncommitted.values():
            self.commit(request)
        self.uncommitted.clear()

    def _commit_pending(self, request: Request) -> None:
        if self.uncommitted.pop(request.request_id, None) is not None:
            self.commit(request)

    def commit(self, request: Request) -> None:
        """Register the request's full, computed blocks in the prefix cache now."""
        cache = self.cache
        if cache is None:
            return
        rb = self.req_blocks[request.request_id]
        num_full = min(request.num_computed_tokens // self.block_size, len(rb.blocks))
        rb.cache_state, replaced = cache.commit(
            rb.cache_state, request.all_token_ids, rb.blocks, num_full
        )
        if replaced:
            pool = self.pool
            for index, cached in replaced:
                self._hold(request, [rb.blocks[index]], -1)
                self._hold(request, [cached])
                pool.touch([cached])
                pool.free_blocks([rb.blocks[index]])
                rb.blocks[index] = cached
                rb.block_ids[index] = cached.block_id

    # -- release, fork, swap -------------------------------------------------------------

    def free(self, request: Request) -> None:
        """Release the request's GPU blocks (tail first, so tails are evicted first) or CPU copy."""
        rid = request.request_id
        if self.uncommitted:
            self._commit_pending(request)
        self.cow_pending.discard(rid)
        rb = self.req_blocks.pop(rid, None)
        if rb is not None:
            del self.block_tables[rid]
            if self.lower_tier_blocks is not None:
                self._hold(request, rb.blocks, -1)
            self.pool.free_blocks(rb.blocks[::-1])
        cpu = self.swapped.pop(rid, None)
        if cpu is not None:
            self._free_cpu.extend(cpu)

    def fork(self, parent: Request, child: Request) -> None:
        """Let ``child`` share all of ``parent``'s blocks (copy-on-write for a partial one)."""
        if self.uncommitted:
            self._commit_pending(parent)
        rb = self.req_blocks[parent.request_id]
        self.pool.touch(rb.blocks)
        cache_state = self.cache.copy_state(rb.cache_state) if self.cache is not None else None
        child_rb = RequestBlocks(list(rb.blocks), cache_state, self.block_size)
        self._hold(child, rb.blocks)
        if parent.num_computed_tokens % self.block_size:
            self.cow_pending.add(parent.request_id)
            self.cow_pending.add(child.request_id)
        self.req_blocks[child.request_id] = child_rb
        self.block_tables[child.request_id] = child_rb.block_ids

    def swap_out(self, request: Request) -> list[BlockCopy] | None:
        """Copy the request's blocks to the CPU pool and free them; None if the pool is full."""
        rid = request.request_id
        rb = self.req_blocks[rid]
        if len(rb.blocks) > len(self._free_cpu):
            return None
        if self.uncommitted:
            self._commit_pending(request)
        copies = [(block.block_id, self._free_cpu.pop()) for block in rb.blocks]
        self.swapped[rid] = [cpu for _, cpu in copies]
        self.cow_pending.discard(rid)
        del self.req_blocks[rid]
        del self.block_tables[rid]
        self._hold(request, rb.blocks, -1)
        self.pool.free_blocks(rb.blocks[::-1])
        return copies

    def swap_in(self, request: Request, num_new_tokens: int) -> list[BlockCopy] | None:
        """Bring a swapped request back with room for ``num_new_tokens``; None if it can't fit."""
        rid = request.request_id
        cpu = self.swapped[rid]
        total = self.swap_in_blocks(request, num_new_tokens)
        if total > self.pool.num_free_blocks or not self._lower_room(request, total):
            return None
        blocks = self.pool.get_new_blocks(total)
        self._hold(request, blocks)
        del self.swapped[rid]
        self._free_cpu.extend(cpu)
        rb = RequestBlocks(blocks, self._new_cache_state(), self.block_size)
        self.req_blocks[rid] = rb
        self.block_tables[rid] = rb.block_ids
        if self.cache is not None:
            self.uncommitted[rid] = request  # its full blocks can be cached again
        return [(c, b.block_id) for c, b in zip(cpu, blocks, strict=False)]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as a fresh engine starts (vLLM's
        ``reset_prefix_cache``); only when no request holds a block, else False."""
        if self.req_blocks or self.swapped or self.pool.num_used_blocks:
            return False
        self.cache = make_prefix_cache(self.prefix_caching, self.block_size)
        self.pool = BlockPool(self.pool.num_blocks, self.cache)
        return True

    def can_ever_fit(self, num_tokens: int, tier: int = 0) -> bool:
        cap = self.pool.num_blocks
        if tier and self.lower_tier_blocks is not None:
            cap = self.lower_tier_blocks
        return self.blocks_needed(num_tokens) <= cap
