"""SGLang RadixAttention-style prefix cache: a token radix tree, page-aligned to blocks.

Every edge holds a whole number of blocks (its tokens and the blocks that store them) and
is split only at block boundaries. A request locks the path it uses by holding references
to the path's blocks (``KVCacheBlock.ref_cnt`` is SGLang's ``lock_ref`` at block
granularity); when it commits a block the tree already holds, it switches to the tree's
block, so every referenced block's ancestors are referenced too. Hence unreferenced cached
blocks always form the tails of subtrees, and evicting least-recently-used leaves, tail
block first, can reach every one of them. Those blocks stay out of the pool's free queue
(``num_evictable`` counts them; ``kept_by`` is their node) until the pool asks the tree to
evict.
"""

from __future__ import annotations

import heapq
from typing import cast

from slotune.engine.kv_cache.block_pool import BlockStateError, KVCacheBlock
from slotune.engine.kv_cache.prefix_cache import Replacement


class RadixNode:
    """An edge of ``len(blocks)`` blocks; ``start`` is the block index where it begins.

    Only the root has no parent, and the root holds no blocks."""

    __slots__ = ("alive", "blocks", "children", "last_access", "parent", "start", "tokens")

    def __init__(self, parent: RadixNode | None, start: int) -> None:
        self.parent = parent
        self.start = start
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.tokens: list[int] = []
        self.blocks: list[KVCacheBlock] = []
        self.last_access = 0
        self.alive = True


def _parent(node: RadixNode) -> RadixNode:
    """The parent of a node that is not the root."""
    parent = node.parent
    if parent is None:
        raise BlockStateError("the radix tree's root has no parent")
    return parent


RadixState = tuple[RadixNode, int]
"""Where a request's committed blocks end: a node and the number of blocks from the root."""


class RadixPrefixCache:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.root = RadixNode(None, 0)
        self.num_evictable = 0
        self._clock = 0
        self._seq = 0
        self._heap: list[tuple[int, int, RadixNode]] = []
        self._compact_at = 1024

    def new_state(self) -> RadixState:
        return (self.root, 0)

    def copy_state(self, state: RadixState) -> RadixState:
        return state

    def match(self, token_ids: list[int], max_blocks: int) -> tuple[list[KVCacheBlock], RadixState]:
        bs = self.block_size
        self._clock += 1
        now = self._clock
        node = end = self.root
        blocks: list[KVCacheBlock] = []
        depth = 0
        while depth < max_blocks:
            base = depth * bs
            child = node.children.get(tuple(token_ids[base : base + bs]))
            if child is None:
                break
            child.last_access = now
            num = len(child.blocks)
            limit = min(num, max_blocks - depth)
            toks = child.tokens
            k = 1
            while k < limit:
                lo = k * bs
                if toks[lo : lo + bs] != token_ids[base + lo : base + lo + bs]:
                    break
                k += 1
            blocks.extend(child.blocks[:k] if k < num else child.blocks)
            depth += k
            end = child
            if k < num:
                break
            node = child
        return blocks, (end, depth)

    def commit(
        self,
        state: RadixState,
        token_ids: list[int],
        blocks: list[KVCacheBlock],
        num_full_blocks: int,
    ) -> tuple[RadixState, list[Replacement]]:
        node, depth = state
        if depth >= num_full_blocks:
            return state, []
        root = self.root
        while node is not root and depth <= node.start:
            node = _parent(node)  # the node was split since; the position is in an ancestor
        bs = self.block_size
        self._clock += 1
        now = self._clock
        replaced: list[Replacement] = []
        for i in range(depth, num_full_blocks):
            key = token_ids[i * bs : (i + 1) * bs]
            off = i - node.start
            if off < len(node.blocks):
                if node.tokens[off * bs : (off + 1) * bs] == key:
                    if node.blocks[off] is not blocks[i]:
                        replaced.append((i, node.blocks[off]))
                    continue
                node = self._split(node, off)
            child = node.children.get(tuple(key))
            if child is not None:
                child.last_access = now
                if child.blocks[0] is not blocks[i]:
                    replaced.append((i, child.blocks[0]))
                node = child
                continue
            block = blocks[i]
            if node is root or node.children:
                new = RadixNode(node, i)
                node.children[tuple(key)] = new
                node = new
            node.tokens.extend(key)
            node.blocks.append(block)
            node.last_access = now
            block.kept_by = node
        return (node, num_full_blocks), replaced

    def _split(self, node: RadixNode, k: int) -> RadixNode:
        """Cut ``node`` after ``k`` blocks; the new prefix node becomes its parent.

        ``node`` keeps its identity (and the suffix), so states that point at it stay valid.
        """
        bs = self.block_size
        parent = _parent(node)
        prefix = RadixNode(parent, node.start)
        prefix.tokens = node.tokens[: k * bs]
        prefix.blocks = node.blocks[:k]
        prefix.last_access = node.last_access
        parent.children[tuple(node.tokens[:bs])] = prefix
        node.tokens = node.tokens[k * bs :]
        node.blocks = node.blocks[k:]
        node.start += k
        node.parent = prefix
        prefix.children[tuple(node.tokens[:bs])] = node
        for block in prefix.blocks:
            block.kept_by = prefix
        return prefix

    def forget_all(self, blocks: list[KVCacheBlock]) -> None:
        """Nothing to do: radix-cached blocks never enter the free queue."""

    def acquire(self, block: KVCacheBlock) -> None:
        self.num_evictable -= 1

    def release(self, block: KVCacheBlock) -> None:
        self.num_evictable += 1
        node = cast(RadixNode, block.kept_by)
        if not node.children:
            self._push(node)

    def _push(self, node: RadixNode) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (node.last_access, self._seq, node))
        if len(self._heap) > self._compact_at:
            self._compact()

    def _compact(self) -> None:
        """Rebuild the eviction heap from the live evictable leaves, dropping stale entries."""
        heap = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.blocks and node.blocks[-1].ref_cnt == 0:
                self._seq += 1
                heap.append((node.last_access, self._seq, node))
        heapq.heapify(heap)
        self._heap = heap
        self._compact_at = max(1024, 4 * len(heap))

    def evict(self, n: int) -> list[KVCacheBlock]:
        """Evict up to ``n`` unreferenced blocks: least recently used leaves, tail first."""
        bs = self.block_size
        heap = self._heap
        out: list[KVCacheBlock] = []
        while len(out) < n and heap:
            stamp, _, node = heapq.heappop(heap)
            if not node.alive or node.children or not node.blocks or node.blocks[-1].ref_cnt:
                continue
            if stamp != node.last_access:
                self._push(node)  # touched since it was queued: requeue at its new age
                continue
            key = tuple(node.tokens[:bs])
            blocks = node.blocks
            while blocks and blocks[-1].ref_cnt == 0 and len(out) < n:
                block = blocks.pop()
                del node.tokens[-bs:]
                block.kept_by = None
                out.append(block)
                self.num_evictable -= 1
            if blocks:
                if blocks[-1].ref_cnt == 0:
                    self._push(node)
                continue
            parent = _parent(node)
            del parent.children[key]
            node.alive = False
            if parent is not self.root and not parent.children and parent.blocks[-1].ref_cnt == 0:
                self._push(parent)
        return out
