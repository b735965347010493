"""KVCacheManager: slot allocation, forks with copy-on-write, and swapping."""

from __future__ import annotations

from slotune.engine import SamplingParams
from slotune.engine.kv_cache import KVCacheManager
from slotune.engine.request import Request


def request(rid: str, num_tokens: int) -> Request:
    return Request(rid, list(range(2, 2 + num_tokens)), SamplingParams())


def test_allocate_slots_reports_when_the_pool_cannot_and_changes_nothing() -> None:
    kv = KVCacheManager(num_gpu_blocks=4, num_cpu_blocks=0, block_size=4, prefix_caching="none")
    a, b = request("a", 10), request("b", 8)
    assert kv.allocate_slots(a, 10)
    assert kv.block_ids("a") == [0, 1, 2]
    assert not kv.allocate_slots(b, 8)
    assert "b" not in kv.req_blocks and kv.num_free_blocks == 1
    a.num_computed_tokens = 10
    assert kv.allocate_slots(a, 2)  # still inside block 2: no allocation
    assert kv.num_free_blocks == 1
    assert kv.allocate_slots(a, 3)
    assert kv.num_free_blocks == 0
    kv.free(a)
    assert kv.num_free_blocks == 4 and not kv.req_blocks


def test_fork_shares_blocks_and_copies_the_partial_block_on_first_write() -> None:
    kv = KVCacheManager(num_gpu_blocks=8, num_cpu_blocks=0, block_size=4, prefix_caching="hash")
    parent = request("p", 6)
    assert kv.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    kv.commit(parent)
    child = Request("p#1", parent.prompt_token_ids, SamplingParams(), parent_id="p", index=1)
    child.num_computed_tokens = 6
    kv.fork(parent, child)
    full, partial = kv.req_blocks["p"].blocks
    assert kv.block_ids("p#1") == [full.block_id, partial.block_id]
    assert full.ref_cnt == 2 and partial.ref_cnt == 2
    assert kv.allocate_slots(child, 1)
    assert kv.take_copy_on_write() == [(partial.block_id, kv.block_ids("p#1")[1])]
    assert partial.ref_cnt == 1 and full.ref_cnt == 2
    assert kv.allocate_slots(parent, 1)  # now the only holder: writes in place
    assert kv.take_copy_on_write() == []
    assert kv.block_ids("p")[1] == partial.block_id
    kv.free(parent)
    kv.free(child)
    assert kv.num_free_blocks == 8


def test_swap_round_trip_lists_the_copies_and_frees_both_pools() -> None:
    kv = KVCacheManager(num_gpu_blocks=6, num_cpu_blocks=4, block_size=4, prefix_caching="none")
    a = request("a", 11)
    assert kv.allocate_slots(a, 11)
    a.num_computed_tokens = 11
    gpu_before = list(kv.block_ids("a"))
    out = kv.swap_out(a)
    assert out is not None and [g for g, _ in out] == gpu_before
    cpu = [c for _, c in out]
    assert len(set(cpu)) == 3 and kv.num_free_cpu_blocks == 1
    assert kv.num_free_blocks == 6 and "a" not in kv.req_blocks
    big = request("big", 20)
    assert kv.allocate_slots(big, 20)  # five blocks: the GPU pool really was freed
    assert kv.swap_in(a, 1) is None  # needs 3 blocks, 1 free
    kv.free(big)
    back = kv.swap_in(a, 1)
    assert back is not None and [c for c, _ in back] == cpu
    assert kv.block_ids("a") == [g for _, g in back]
    assert kv.num_free_cpu_blocks == 4 and kv.num_free_blocks == 3
    kv.free(a)
    b = request("b", 16)
    assert kv.allocate_slots(b, 16)
    assert kv.swap_out(b) is not None
    c = request("c", 4)
    assert kv.allocate_slots(c, 4)
    assert kv.swap_out(c) is None  # the CPU pool is full: the caller recomputes instead
    kv.free(b)
    assert kv.num_free_cpu_blocks == 4


def test_prefix_hit_adopts_cached_blocks_and_counts_tokens() -> None:
    kv = KVCacheManager(num_gpu_blocks=8, num_cpu_blocks=0, block_size=4, prefix_caching="radix")
    a = request("a", 9)
    assert kv.allocate_slots(a, 9, kv.get_computed_blocks(a))
    a.num_computed_tokens = 9
    kv.commit(a)
    kv.free(a)
    b = request("b", 9)
    hit = kv.get_computed_blocks(b)
    assert hit is not None and hit.num_tokens == 8  # 9 tokens: the last is computed
    assert kv.allocate_slots(b, 1, hit)
    assert kv.prefix_cache_queries_tokens == 18 and kv.prefix_cache_hit_tokens == 8
    assert kv.req_blocks["b"].blocks[:2] == hit.blocks
