"""The block pool, its O(1) LRU free queue, and the two prefix caches on their own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotune.engine.kv_cache import (
    BlockPool,
    FreeKVCacheBlockQueue,
    HashPrefixCache,
    KVCacheBlock,
    RadixPrefixCache,
)


def ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [b.block_id for b in blocks]


def test_free_queue_pops_front_appends_back_and_removes_from_middle() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 5
    assert queue.popleft() is blocks[0]
    queue.remove(blocks[2])
    assert ids(queue.blocks()) == [1, 3, 4]
    queue.append(blocks[0])
    assert ids(queue.blocks()) == [1, 3, 4, 0]
    assert queue.num_free_blocks == 4
    assert blocks[2] not in queue and blocks[0] in queue
    with pytest.raises(ValueError, match="not free"):
        queue.remove(blocks[2])
    for _ in range(4):
        queue.popleft()
    with pytest.raises(IndexError):
        queue.popleft()


def test_pool_counts_references_and_refuses_double_free() -> None:
    pool = BlockPool(4)
    a = pool.get_new_blocks(3)
    assert [b.ref_cnt for b in a] == [1, 1, 1]
    assert pool.num_free_blocks == 1
    pool.touch(a[:1])
    pool.free_blocks(a)
    assert a[0].ref_cnt == 1 and pool.num_free_blocks == 3
    pool.free_blocks(a[:1])
    assert pool.num_free_blocks == 4
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.free_blocks(a[:1])
    with pytest.raises(ValueError, match="5 blocks requested"):
        BlockPool(4).get_new_blocks(5)


def test_hash_cache_reuses_cached_free_blocks_and_evicts_least_recently_freed() -> None:
    cache = HashPrefixCache(block_size=2)
    pool = BlockPool(4, cache)
    tokens_a, tokens_b = [1, 2, 3, 4], [7, 8, 9, 9]
    a = pool.get_new_blocks(2)
    state, _ = cache.commit(cache.new_state(), tokens_a, a, 2)
    b = pool.get_new_blocks(2)
    cache.commit(cache.new_state(), tokens_b, b, 2)
    pool.free_blocks(a[::-1])  # a's tail first: it goes first
    pool.free_blocks(b[::-1])
    assert pool.num_free_blocks == 4 and len(cache) == 4
    hit, hashes = cache.match([1, 2, 3, 4, 5], 2)
    assert hit == a and hashes == state
    assert cache.match([1, 2, 9, 9], 2)[0] == a[:1]  # the chain stops at the first miss
    pool.touch(hit)
    assert pool.num_free_blocks == 2
    (fresh,) = pool.get_new_blocks(1)
    assert fresh is b[1]  # b's tail was the least recently freed
    assert fresh.block_hash is None and len(cache) == 3
    assert cache.match(tokens_b, 2)[0] == b[:1]


def radix_insert(cache: RadixPrefixCache, pool: BlockPool, tokens: list[int]) -> list:
    bs = cache.block_size
    blocks = pool.get_new_blocks(len(tokens) // bs)
    _, replaced = cache.commit(cache.new_state(), tokens, blocks, len(blocks))
    for index, cached in replaced:
        pool.touch([cached])
        pool.free_blocks([blocks[index]])
        blocks[index] = cached
    return blocks


def test_radix_splits_edges_at_block_boundaries_and_shares_blocks() -> None:
    cache = RadixPrefixCache(block_size=2)
    pool = BlockPool(16, cache)
    a = radix_insert(cache, pool, [1, 1, 2, 2, 3, 3])
    assert len(cache.root.children) == 1
    (node,) = cache.root.children.values()
    assert node.tokens == [1, 1, 2, 2, 3, 3] and ids(node.blocks) == ids(a)
    b = radix_insert(cache, pool, [1, 1, 2, 2, 9, 9])
    assert b[:2] == a[:2] and b[2] is not a[2]  # the shared prefix uses the tree's blocks
    assert [blk.ref_cnt for blk in a] == [2, 2, 1]
    (prefix,) = cache.root.children.values()
    assert prefix.tokens == [1, 1, 2, 2] and len(prefix.children) == 2
    hit, (end, depth) = cache.match([1, 1, 2, 2, 9, 9, 4], 3)
    assert hit == b and depth == 3 and end.tokens == [9, 9]
    hit, _ = cache.match([1, 1, 2, 2, 3, 3], 2)  # capped inside an edge: no split needed
    assert hit == a[:2]


def test_radix_keeps_unreferenced_blocks_and_evicts_lru_leaves_tail_first() -> None:
    cache = RadixPrefixCache(block_size=1)
    pool = BlockPool(6, cache)
    old = radix_insert(cache, pool, [1, 2, 3])
    new = radix_insert(cache, pool, [1, 2, 5])
    pool.free_blocks(old[::-1])
    assert cache.num_evictable == 1  # [3]; [1, 2] are still held by ``new``
    pool.free_blocks(new[::-1])
    assert cache.num_evictable == 4 and pool.num_free_blocks == 6
    assert pool.free_queue.num_free_blocks == 2
    cache.match([1, 2, 5], 3)  # touch [5]: [3] is now the least recently used leaf
    got = pool.get_new_blocks(3)
    assert old[2] in got and new[2] not in got
    assert cache.match([1, 2, 5], 3)[0] == new
    assert cache.match([1, 2, 3], 3)[0] == new[:2]
    pool.free_blocks(got)
    got = pool.get_new_blocks(6)  # everything: leaves go first, then their parents
    assert cache.num_evictable == 0 and not cache.root.children
    assert sorted(ids(got)) == list(range(6))


def test_radix_eviction_heap_stays_bounded() -> None:
    cache = RadixPrefixCache(block_size=1)
    pool = BlockPool(4096, cache)
    for i in range(1500):
        blocks = radix_insert(cache, pool, [1, 2, 3 + i % 7, 100 + i])
        pool.free_blocks(blocks[::-1])
        cache.match([1, 2, 3 + i % 7], 3)  # touch: leaves stale heap entries behind
    assert cache._compact_at > 1024  # it was rebuilt from the live leaves at least once
    assert len(cache._heap) < 2 * 1500 + 8 * 2  # ~one entry per leaf, plus recent pushes
    got = pool.get_new_blocks(4096)
    assert len(got) == 4096 and cache.num_evictable == 0 and not cache.root.children


def test_free_queue_pops_many_at_once() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert ids(queue.popleft_n(3)) == [0, 1, 2]
    assert ids(queue.blocks()) == [3] and queue.num_free_blocks == 1
    assert queue.popleft_n(0) == []
    with pytest.raises(IndexError):
        queue.popleft_n(2)
    assert ids(queue.popleft_n(1)) == [3] and queue.blocks() == []
    queue.append(blocks[1])
    assert ids(queue.blocks()) == [1]


queue_ops = st.lists(
    st.tuples(st.sampled_from(["pop", "remove", "remove", "append", "extend"]), st.integers(0, 99)),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(queue_ops)
def test_free_queue_matches_a_plain_list(program: list[tuple[str, int]]) -> None:
    blocks = [KVCacheBlock(i) for i in range(40)]
    queue = FreeKVCacheBlockQueue(blocks[:20])
    model = blocks[:20]
    for op, arg in program:
        out = [b for b in blocks if b not in model]
        if op == "pop":
            n = arg % (len(model) + 1)
            assert queue.popleft_n(n) == model[:n]
            del model[:n]
        elif op == "remove" and model:
            block = model.pop(arg % len(model))
            queue.remove(block)
        elif op == "append" and out:
            model.append(out[arg % len(out)])
            queue.append(model[-1])
        elif op == "extend":
            more = out[arg % (len(out) + 1) :]
            model += more
            queue.extend(more)
        assert queue.blocks() == model and queue.num_free_blocks == len(model)
        assert [b in queue for b in blocks] == [b in model for b in blocks]


@pytest.mark.parametrize("freed_order", ["tail first", "head first", "mixed"])
def test_hit_lifetimes_tell_how_many_allocations_a_cached_prefix_survives(
    freed_order: str,
) -> None:
    """Against the real thing: for each k, hand out k blocks, then look the request up."""
    from slotune.engine.kv_cache.manager import KVCacheManager
    from slotune.engine.request import Request
    from slotune.engine.sampling_params import SamplingParams

    def setup() -> tuple[KVCacheManager, Request]:
        kv = KVCacheManager(12, 0, 4, "hash")
        spare = kv.pool.get_new_blocks(3)  # free blocks ahead of the request's in the queue
        req = Request("r", list(range(100, 121)), SamplingParams(max_tokens=1))
        assert kv.allocate_slots(req, 21)
        req.num_computed_tokens = 20  # five full blocks
        kv.commit(req)
        blocks = kv.req_blocks["r"].blocks
        order = {"tail first": blocks[::-1], "head first": blocks, "mixed": blocks[2:] + blocks[:2]}
        kv.pool.free_blocks(spare[:2])
        kv.pool.free_blocks(order[freed_order])  # one reference each: all freed, in order
        kv.pool.free_blocks(spare[2:])
        del kv.req_blocks["r"], kv.block_tables["r"]
        req.num_computed_tokens = 0
        return kv, req

    kv, req = setup()
    lasts = kv.hit_lifetimes(req)
    assert lasts is not None and len(lasts) == 5
    for k in range(kv.num_free_blocks + 1):
        kv, req = setup()
        kv.pool.get_new_blocks(k)
        hit = kv.get_computed_blocks(req)
        assert hit is not None
        assert len(hit.blocks) == sum(last >= k for last in lasts), (k, lasts)
    kv, req = setup()
    kv.pool.touch(kv.get_computed_blocks(req).blocks[:1])  # type: ignore[union-attr]
    assert kv.hit_lifetimes(req) is None  # a hit block is held
