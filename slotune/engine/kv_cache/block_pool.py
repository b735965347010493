"""Fixed KV blocks with reference counts, an O(1) LRU free queue, and the pool that owns them.

A block's ``ref_cnt`` is the number of request block tables that hold it; the prefix cache
holding a block does not count. Unreferenced blocks are free: either in the free queue
(a cache may leave its key on a block there until the block is reused, as vLLM does) or
kept by the cache (``kept_by`` set) until the pool asks it to evict them. The pool sees the
cache only through :class:`BlockKeeper`.
"""

from __future__ import annotations

from typing import Protocol


class BlockStateError(RuntimeError):
    """A block's reference count or cache membership broke the pool's invariants."""


class KVCacheBlock:
    """One page of ``block_size`` token slots."""

    __slots__ = (
        "block_hash",
        "block_id",
        "block_key",
        "kept_by",
        "next_free",
        "prev_free",
        "ref_cnt",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None  # the hash of its cache key while cached
        self.block_key: object | None = None  # its cache key while cached
        self.kept_by: object | None = None  # the cache's record while it keeps the block
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    @property
    def is_cached(self) -> bool:
        return self.block_hash is not None or self.kept_by is not None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self.is_cached})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks: pop from the front (LRU), append at the back.

    Every operation is O(1); ``remove`` takes a block out of the middle when a cached free
    block is hit. Two sentinel blocks bound the list so no branch handles empty ends.
    """

    __slots__ = ("_head", "_tail", "num_free_blocks")

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        prev = self._head
        for block in blocks:
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = self._tail
        self._tail.prev_free = prev
        self.num_free_blocks = len(blocks)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise IndexError("FreeKVCacheBlockQueue.popleft: no free block")
        nxt = block.next_free
        if nxt is None:
            raise BlockStateError(f"free block {block.block_id} is unlinked")
        self._head.next_free = nxt
        nxt.prev_free = self._head
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """The ``n`` front blocks, unlinked in one pass."""
        if n > self.num_free_blocks:
            raise IndexError(
                f"FreeKVCacheBlockQueue.popleft_n: {n} wanted, {self.num_free_blocks} free"
            )
        out = []
        block = self._head.next_free
        for _ in range(n):
            if block is None:
                raise BlockStateError("FreeKVCacheBlockQueue.popleft_n: the list is broken")
            out.append(block)
            nxt = block.next_free
            block.prev_free = block.next_free = None
            block = nxt
        if block is None:
            raise BlockStateError("FreeKVCacheBlockQueue.popleft_n: the list is broken")
        self._head.next_free = block
        block.prev_free = self._head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"FreeKVCacheBlockQueue.remove: block {block.block_id} is not free")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        if last is None:
            raise BlockStateError("FreeKVCacheBlockQueue.append: the list is broken")
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def extend(self, blocks: list[KVCacheBlock]) -> None:
        """Append the blocks in order, linked in one pass."""
        last = self._tail.prev_free
        if last is None:
            raise BlockStateError("FreeKVCacheBlockQueue.extend: the list is broken")
        for block in blocks:
            last.next_free = block
            block.prev_free = last
            last = block
        last.next_free = self._tail
        self._tail.prev_free = last
        self.num_free_blocks += len(blocks)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.next_free is not None

    def positions(self, blocks: list[KVCacheBlock]) -> list[int] | None:
        """Each block's place in the queue (0: popped next); None if one is not in it.
        Walks the queue from the front as far as the last of them."""
        if not all(block.next_free is not None for block in blocks):
            return None
        index = {id(block): i for i, block in enumerate(blocks)}
        out = [0] * len(blocks)
        left = len(index)
        pos = 0
        block = self._head.next_free
        while left and block is not None:
            i = index.get(id(block))
            if i is not None:
                out[i] = pos
                left -= 1
            pos += 1
            block = block.next_free
        return out

    def blocks(self) -> list[KVCacheBlock]:
        """Free blocks front (evicted first) to back; for tests and debugging."""
        out = []
        block = self._head.next_free
        while block is not self._tail and block is not None:
            out.append(block)
            block = block.next_free
        return out


class BlockKeeper(Protocol):
    """What the pool needs from the prefix cache over its blocks.

    A keeper may keep unreferenced blocks out of the free queue: it marks them with
    ``kept_by`` and counts them in ``num_evictable``; the pool hands such a block back to
    it when it gains its first reference or loses its last one.
    """

    num_evictable: int
    """Unreferenced blocks the keeper holds outside the free queue."""

    def forget_all(self, blocks: list[KVCacheBlock]) -> None:
        """The pool reuses these free blocks (fresh from its queue) for new content."""
        ...

    def acquire(self, block: KVCacheBlock) -> None:
        """A block it keeps (``kept_by`` set) gains its first reference."""
        ...

    def release(self, block: KVCacheBlock) -> None:
        """A block it keeps (``kept_by`` set) lost its last reference."""
        ...

    def evict(self, n: int) -> list[KVCacheBlock]:
        """Drop up to ``n`` unreferenced kept blocks and return them to be freed."""
        ...


class BlockPool:
    """All GPU blocks, their reference counts and the prefix cache (if any) over them."""

    def __init__(self, num_blocks: int, cache: BlockKeeper | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"BlockPool: num_blocks must be at least 1 (got {num_blocks})")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cache = cache

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds: the free queue plus unreferenced blocks a tree keeps."""
        cache = self.cache
        if cache is None:
            return self.free_queue.num_free_blocks
        return self.free_queue.num_free_blocks + cache.num_evictable

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` free blocks (ref 1 each), evicting cached ones least recently used first."""
        queue = self.free_queue
        cache = self.cache
        if n > queue.num_free_blocks:
            if cache is not None:
                for block in cache.evict(n - queue.num_free_blocks):
                    queue.append(block)
            if n > queue.num_free_blocks:
                raise ValueError(
                    f"BlockPool.get_new_blocks: {n} blocks requested, {queue.num_free_blocks} free"
                )
        out = queue.popleft_n(n)
        for block in out:
            block.ref_cnt = 1
        if cache is not None:
            cache.forget_all(out)
        return out

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take one more reference on each block (a prefix-cache hit or a fork)."""
        queue = self.free_queue
        cache = self.cache
        for block in blocks:
            if block.ref_cnt == 0:
                if cache is not None and block.kept_by is not None:
                    cache.acquire(block)
                else:
                    queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order (the first is evicted first)."""
        freed = []
        cache = self.cache
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if cache is not None and block.kept_by is not None:
                    cache.release(block)
                else:
                    freed.append(block)
            elif block.ref_cnt < 0:
                raise BlockStateError(f"BlockPool.free_blocks: block {block.block_id} freed twice")
        if freed:
            self.free_queue.extend(freed)
