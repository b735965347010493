"""Fixed KV blocks with reference counts, an O(1) LRU free queue, and the pool that owns them.

A block's ``ref_cnt`` is the number of request block tables that hold it; the prefix cache
holding a block does not count. Unreferenced blocks are free: either in the free queue
(hash kind: a cached block keeps its hash there until it is reused, as in vLLM) or, for the
radix kind, still inside the tree until it evicts them (leaves only, least recently used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slotune.engine.kv_cache.prefix_cache import PrefixCache


class KVCacheBlock:
    """One page of ``block_size`` token slots."""

    __slots__ = (
        "block_hash",
        "block_id",
        "block_key",
        "next_free",
        "prev_free",
        "radix_node",
        "ref_cnt",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None  # hash-cache: the hash of its key while cached
        self.block_key: object | None = None  # hash-cache: its key while cached
        self.radix_node: object | None = None  # radix-tree node while cached
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    @property
    def is_cached(self) -> bool:
        return self.block_hash is not None or self.radix_node is not None

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
        self._head.next_free = nxt
        nxt.prev_free = self._head  # type: ignore[union-attr]
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
            out.append(block)
            nxt = block.next_free  # type: ignore[union-attr]
            block.prev_free = block.next_free = None  # type: ignore[union-attr]
            block = nxt
        self._head.next_free = block
        block.prev_free = self._head  # type: ignore[union-attr]
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
        last.next_free = block  # type: ignore[union-attr]
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def extend(self, blocks: list[KVCacheBlock]) -> None:
        """Append the blocks in order, linked in one pass."""
        last = self._tail.prev_free
        for block in blocks:
            last.next_free = block  # type: ignore[union-attr]
            block.prev_free = last
            last = block
        last.next_free = self._tail  # type: ignore[union-attr]
        self._tail.prev_free = last
        self.num_free_blocks += len(blocks)

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.next_free is not None

    def blocks(self) -> list[KVCacheBlock]:
        """Free blocks front (evicted first) to back; for tests and debugging."""
        out = []
        block = self._head.next_free
        while block is not self._tail and block is not None:
            out.append(block)
            block = block.next_free
        return out


class BlockPool:
    """All GPU blocks, their reference counts and the prefix cache (if any) over them."""

    def __init__(self, num_blocks: int, cache: PrefixCache | None = None) -> None:
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
        for block in blocks:
            if block.ref_cnt == 0:
                if block.radix_node is not None:
                    self.cache.acquire(block)  # type: ignore[union-attr]
                else:
                    queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order (the first is evicted first)."""
        freed = []
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.radix_node is not None:
                    self.cache.release(block)  # type: ignore[union-attr]
                else:
                    freed.append(block)
            elif block.ref_cnt < 0:
                raise RuntimeError(f"BlockPool.free_blocks: block {block.block_id} freed twice")
        if freed:
            self.free_queue.extend(freed)
