"""The decode fast-forward primitives: a stretch of k decode steps applied at once leaves the
engine exactly where k single steps would (same tokens, same step count, same decisions)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotune.engine import Engine, EngineConfig, SamplingParams
from tests.engine.deterministic import DeterministicExecutor, token_for
from tests.engine.invariants import check_all, check_drained
from tests.engine.test_properties import ALL_CONFIGS, MAX_MODEL_LEN, Workload, workloads


def drive(w: Workload, cfg: tuple, fast: bool) -> tuple[dict, dict, tuple]:
    policy, preemption, caching, block_size = cfg
    config = EngineConfig(
        max_num_batched_tokens=w.budget if policy == "chunked" else MAX_MODEL_LEN + w.budget,
        long_prefill_token_threshold=w.threshold if policy == "chunked" else 0,
        block_size=block_size,
        max_num_seqs=w.max_num_seqs,
        max_model_len=MAX_MODEL_LEN,
        preemption_mode=preemption,
        prefix_caching=caching,
        policy=policy,
    )
    need = max(-(-(len(j.prompt) + j.max_tokens) // block_size) for j in w.jobs)
    # a stretch bypasses the executor, so its model of the KV contents would fall behind
    executor = DeterministicExecutor(need + w.extra_blocks * 2, w.cpu_blocks, check_kv=not fast)
    engine = Engine(config, executor)
    scheduler = engine.scheduler
    tokens: dict[tuple[str, int], list[int]] = {}
    reasons: dict[tuple[str, int], str] = {}
    arrivals = sorted({j.arrive for j in w.jobs})
    step = stretches = 0
    while step <= arrivals[-1] or engine.has_unfinished_requests():
        for j in w.jobs:
            if j.arrive == step:
                params = SamplingParams(max_tokens=j.max_tokens, n=j.n, ignore_eos=True)
                engine.add_request(j.rid, j.prompt, params)
        upcoming = [a for a in arrivals if a > step]
        k = scheduler.decode_stretch_limit((upcoming[0] - step) if upcoming else 10**6)
        if fast and k >= 2:
            batch = {
                r.request_id: [token_for(r.parent_id, r.index, r.num_tokens + i) for i in range(k)]
                for r in scheduler.running
            }
            ids = {rid: (r.parent_id, r.index) for rid, r in scheduler.requests.items()}
            for rid, reason in scheduler.advance_decodes(batch, k).finished.items():
                reasons[ids[rid]] = reason
            for rid, toks in batch.items():
                tokens.setdefault(ids[rid], []).extend(toks)
            step += k
            stretches += 1
        elif engine.has_unfinished_requests():
            for out in engine.step():
                tokens.setdefault((out.request_id, out.index), []).extend(out.new_token_ids)
                if out.finished:
                    reasons[(out.request_id, out.index)] = out.finish_reason  # type: ignore[assignment]
            step += 1
        else:
            step += 1
        check_all(engine, None)
    check_drained(engine)
    stats = engine.stats()
    return tokens, reasons, (stats["steps"], stats["num_preemptions"], stats["num_swap_outs"])


@settings(max_examples=40, deadline=None)
@given(workloads(), st.sampled_from(ALL_CONFIGS))
def test_stretches_equal_single_steps(w: Workload, cfg: tuple) -> None:
    w = replace(w, jobs=[replace(j, abort_at=None) for j in w.jobs])
    assert drive(w, cfg, fast=True) == drive(w, cfg, fast=False)


def test_limit_stops_at_block_shortage_and_finishing_requests() -> None:
    config = EngineConfig(block_size=4, max_num_seqs=4, prefix_caching="none")
    engine = Engine(config, DeterministicExecutor(num_gpu_blocks=6))
    engine.add_request("a", [2] * 4, SamplingParams(max_tokens=30, ignore_eos=True))
    engine.add_request("b", [3] * 6, SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()  # both prompts: a holds 1 block, b 2 blocks; each sampled one token
    scheduler = engine.scheduler
    assert scheduler.decode_stretch_limit(100) == 4  # b's 5th token finishes it
    assert scheduler.decode_stretch_limit(3) == 3
    engine.add_request("c", [4], SamplingParams(max_tokens=1))
    assert scheduler.decode_stretch_limit(100) == 0  # c could be admitted
    engine.step()
    engine.abort_request("b")
    # a: 5 of its 8 slots computed, so 3 spare, plus 4 free blocks of 4 slots: 19 steps
    assert scheduler.decode_stretch_limit(100) == 19
    engine.kv_cache.pool.get_new_blocks(1)  # someone else takes a block
    assert scheduler.decode_stretch_limit(100) == 15


def test_advance_finishes_on_a_final_stop_token_and_refuses_an_early_one() -> None:
    engine = Engine(EngineConfig(block_size=4), DeterministicExecutor(check_kv=False))
    engine.add_request("a", [2, 3], SamplingParams(max_tokens=20, stop_token_ids=(7, 8)))
    engine.step()
    scheduler = engine.scheduler
    with pytest.raises(ValueError, match="would stop before the last step"):
        scheduler.advance_decodes({"a": [5, 7, 6]}, 3)
    assert scheduler.advance_decodes({"a": [5, 6, 8]}, 3).finished == {"a": "stop"}
    assert not engine.has_unfinished_requests()
    assert engine.stats()["steps"] == 4 and engine.kv_cache.num_free_blocks == 1024
    assert scheduler.finished_request_ids == {"a"}
    assert engine.step() == []  # nothing to run: the executor is not called ...
    engine.add_request("b", [2], SamplingParams(max_tokens=1))
    engine.step()  # ... and hears of "a" with the next batch
    assert engine.executor.outputs[-1].finished_request_ids == {"a"}
