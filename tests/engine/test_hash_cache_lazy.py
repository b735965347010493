"""The hash cache hashes dormant groups lazily; it must leave what eager hashing leaves.

The reference below is the eager cache (hash every full block at commit). Both run the
same random sequence of admissions (lookup, hit, new blocks), growth, commits, forks and
frees over a tiny token alphabet, so prefixes are shared, blocks are reused and groups
are replayed at every point of their lives. Lookups of a list looked up before (grown in
place since) check what the hash cache remembers of its last lookup.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from slotune.engine.kv_cache import BlockPool, HashPrefixCache
from slotune.engine.kv_cache.block_pool import KVCacheBlock


class EagerHashCache:
    num_evictable = 0

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: dict[int, KVCacheBlock] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def new_state(self) -> list[int]:
        return []

    def copy_state(self, state: list[int]) -> list[int]:
        return list(state)

    def match(self, token_ids: list[int], max_blocks: int) -> tuple[list[KVCacheBlock], list]:
        bs, blocks, hashes, parent = self.block_size, [], [], None
        for i in range(max_blocks):
            key = (parent, tuple(token_ids[i * bs : (i + 1) * bs]))
            block = self._blocks.get(hash(key))
            if block is None or block.block_key != key:
                break
            blocks.append(block)
            parent = hash(key)
            hashes.append(parent)
        return blocks, hashes

    def commit(self, hashes: list, token_ids: list[int], blocks: list, num_full: int) -> tuple:
        bs = self.block_size
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), num_full):
            key = (parent, tuple(token_ids[i * bs : (i + 1) * bs]))
            parent = h = hash(key)
            hashes.append(h)
            block = blocks[i]
            if block.block_hash is None and self._blocks.setdefault(h, block) is block:
                block.block_hash, block.block_key = h, key
        return hashes, []

    def forget_all(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            if block.block_hash is not None:
                del self._blocks[block.block_hash]
                block.block_hash = block.block_key = None


class World:
    def __init__(self, cache: object, num_blocks: int = 10) -> None:
        self.cache = cache
        self.pool = BlockPool(num_blocks, cache)  # type: ignore[arg-type]
        self.reqs: list[list] = []  # [tokens, blocks, state]
        self.trace: list[object] = []
        self.gone: list[list[int]] = []  # the token lists of freed requests

    def admit(self, tokens: list[int], again: bool = False) -> bool:
        """A new request with ``tokens`` (a copy), or ``again``: the freed request whose
        list it is comes back with its own list. Its state may hold a dormant group's
        placeholders until a replay, so only its length is compared here (whole states
        at the end, after every group is replayed)."""
        bs = self.cache.block_size  # type: ignore[attr-defined]
        hit, state = self.cache.match(tokens, (len(tokens) - 1) // bs)  # type: ignore[attr-defined]
        self.trace.append(([b.block_id for b in hit], len(state)))
        need = -(-len(tokens) // bs) - len(hit)
        if need > self.pool.free_queue.num_free_blocks - sum(b.ref_cnt == 0 for b in hit):
            return False
        self.pool.touch(hit)
        own = tokens if again else list(tokens)
        self.reqs.append([own, hit + self.pool.get_new_blocks(need), state])
        return True

    def commit(self, i: int, k: int) -> None:
        tokens, blocks, state = self.reqs[i % len(self.reqs)]
        num_full = min(len(tokens) // self.cache.block_size, len(blocks), k)  # type: ignore[attr-defined]
        self.cache.commit(state, tokens, blocks, num_full)  # type: ignore[attr-defined]

    def grow(self, i: int, extra: list[int]) -> None:
        req = self.reqs[i % len(self.reqs)]
        bs = self.cache.block_size  # type: ignore[attr-defined]
        need = -(-(len(req[0]) + len(extra)) // bs) - len(req[1])
        if need > self.pool.free_queue.num_free_blocks:
            return
        req[0].extend(extra)
        req[1] += self.pool.get_new_blocks(need)

    def fork(self, i: int) -> None:
        tokens, blocks, state = self.reqs[i % len(self.reqs)]
        bs = self.cache.block_size  # type: ignore[attr-defined]
        full = len(state) * bs
        self.pool.touch(blocks[: len(state)])
        self.reqs.append([tokens[:full], blocks[: len(state)], self.cache.copy_state(state)])  # type: ignore[attr-defined]

    def free(self, i: int) -> None:
        tokens, blocks, _ = self.reqs.pop(i % len(self.reqs))
        self.pool.free_blocks(blocks[::-1])
        self.gone.append(tokens)

    def again(self, i: int, extra: list[int]) -> None:
        """Look up a freed request's own token list again (grown in place by ``extra``), as
        a preempted request waits: looked up step after step until it fits, then back."""
        if self.gone:
            tokens = self.gone[i % len(self.gone)]
            tokens.extend(extra)
            if self.admit(tokens, again=True):
                del self.gone[i % len(self.gone)]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.lists(st.integers(0, 1), min_size=1, max_size=9)),
        st.tuples(st.just("commit"), st.integers(0, 9), st.integers(0, 5)),
        st.tuples(st.just("grow"), st.integers(0, 9), st.lists(st.integers(0, 1), max_size=4)),
        st.tuples(st.just("fork"), st.integers(0, 9)),
        st.tuples(st.just("free"), st.integers(0, 9)),
        st.tuples(st.just("again"), st.integers(0, 9), st.lists(st.integers(0, 1), max_size=3)),
    ),
    max_size=40,
)


@settings(max_examples=600, deadline=None)
@given(ops)
@example(  # a second request joins a group after one of the first's blocks was reused
    [
        ("admit", [0, 0, 1, 1, 1]),
        ("commit", 0, 2),
        ("free", 0),
        ("admit", [1] * 13),
        ("admit", [0, 0]),
        ("grow", 1, [0, 1]),
        ("commit", 1, 2),
        ("admit", [0, 0, 1, 1, 1]),
    ]
)
@example(  # a logged block reused while its group is dormant must not be replayed as cached
    [
        ("admit", [0, 1, 0, 0, 0, 0]),
        ("admit", [0, 0, 0, 0, 0, 0, 0]),
        ("commit", 0, 3),
        ("free", 0),
        ("admit", [0, 0, 0, 0, 0, 0, 0]),
    ]
)
@example(  # a list looked up again after one of the blocks it found was reused, then grown
    [
        ("admit", [1, 1, 1]),
        ("admit", [0, 0, 1, 1, 1, 0, 1]),
        ("commit", 1, 3),
        ("free", 1),
        ("again", 0, []),
        ("free", 1),
        ("grow", 0, [1, 1, 1, 1]),
        ("grow", 0, [1, 1, 1, 1]),
        ("grow", 0, [1, 1, 1, 1]),
        ("again", 0, []),
        ("again", 0, [1, 0]),
    ]
)
def test_lazy_hash_cache_equals_eager(program: list[tuple]) -> None:
    same_as_eager(program, 10)


def same_as_eager(program: list[tuple], num_blocks: int) -> None:
    """Run ``program`` on both caches over a pool of ``num_blocks``: the same hits,
    free-queue order, cached keys and (once every group is replayed) states."""
    lazy = World(HashPrefixCache(2), num_blocks)
    eager = World(EagerHashCache(2), num_blocks)
    for op, *args in program:
        for world in (lazy, eager):
            if op not in ("admit", "again") and not world.reqs:
                continue
            getattr(world, op)(*args)
        assert lazy.trace == eager.trace
        assert [b.block_id for b in lazy.pool.free_queue.blocks()] == [
            b.block_id for b in eager.pool.free_queue.blocks()
        ]
    assert len(lazy.cache) == len(eager.cache)  # type: ignore[arg-type]
    hashed = [(b.block_hash, b.block_key) for b in lazy.pool.blocks]
    assert hashed == [(b.block_hash, b.block_key) for b in eager.pool.blocks]
    assert [r[2] for r in lazy.reqs] == [r[2] for r in eager.reqs]


_tokens = st.lists(st.integers(0, 5), min_size=3, max_size=12)
_extra = st.lists(st.integers(0, 5), max_size=3)
readmissions = st.lists(
    st.one_of(
        # a new request, committed as far as it is full
        st.tuples(_tokens).map(lambda t: [("admit", t[0]), ("commit", -1, 6)]),
        # a request preempted, and a new one taking blocks from the free queue's front
        st.tuples(st.integers(0, 9), _tokens, st.integers(0, 6)).map(
            lambda t: [("free", t[0]), ("admit", t[1]), ("commit", -1, t[2])]
        ),
        # a preempted request coming back (looked up again, grown or not), committed
        st.tuples(st.integers(0, 9), _extra, st.integers(1, 6)).map(
            lambda t: [("again", t[0], t[1]), ("commit", -1, t[2])]
        ),
        st.tuples(st.integers(0, 9), _extra).map(
            lambda t: [("grow", t[0], t[1]), ("commit", t[0], 6)]
        ),
    ),
    max_size=25,
).map(lambda macros: [op for macro in macros for op in macro])


@settings(max_examples=400, deadline=None)
@given(readmissions, st.integers(6, 24))
@example(  # a block its request lost unlogged comes back to it at another position
    [
        *[("admit", [0, 0, 0]), ("commit", -1, 6), ("free", 0)],
        *[("admit", [0, 2, 0, 0, 0, 0, 0, 0, 0, 0]), ("commit", -1, 0)],
        *[("grow", 0, [0, 0, 0]), ("commit", 0, 6)],
        *[("admit", [0, 0, 0, 0, 0, 0]), ("commit", -1, 6)],
        *[("again", 0, [1, 0, 0]), ("commit", -1, 1), ("free", 0)],
        *[("admit", [0, 1, 0]), ("commit", -1, 0), ("free", 1)],
        *[("admit", [0, 1, 0, 0, 0]), ("commit", -1, 0), ("grow", 0, [0]), ("commit", 0, 6)],
        *[("again", 1, [0]), ("commit", -1, 1), ("again", 0, []), ("commit", -1, 1)],
        *[("admit", [0, 0, 0]), ("commit", -1, 6)],
    ],
    19,
)
@example(  # a request back twice: the second lookup reads the log its return grew
    [
        *[("admit", [0, 0, 0]), ("commit", -1, 6), ("free", 0)],
        *[("admit", [0, 1, 0]), ("commit", -1, 0), ("again", 0, [0, 0]), ("commit", -1, 1)],
        *[("admit", [0, 1, 0]), ("commit", -1, 6), ("free", 1)],
        *[("admit", [0, 1, 0]), ("commit", -1, 0), ("again", 0, []), ("commit", -1, 1)],
    ],
    6,
)
def test_readmitted_requests_equal_eager(program: list[tuple], num_blocks: int) -> None:
    """Preempted requests coming back (their own lists looked up while their groups are
    dormant: no replay), and preempted again after committing positions again."""
    same_as_eager(program, num_blocks)
