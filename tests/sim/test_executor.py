import subprocess
import sys

import pytest

from slotune.engine.config import EngineConfig
from slotune.engine.request import Request
from slotune.engine.sampling_params import SamplingParams
from slotune.engine.scheduler_output import SchedulerOutput
from slotune.engine.sim import SimExecutor


def _request(rid: str, prompt: int, computed: int, stop: tuple[int, ...] = ()) -> Request:
    req = Request(
        rid,
        list(range(1, prompt + 1)),
        SamplingParams(max_tokens=100, stop_token_ids=stop),
        eos_token_id=2,
    )
    req.num_computed_tokens = computed
    return req


def _output(
    chunks: dict[str, tuple[int, int, int]], **copies: list[tuple[int, int]]
) -> SchedulerOutput:
    """``chunks[rid] = (prompt_len, computed, scheduled)``; a request samples when its chunk
    reaches the end of its tokens."""
    so = SchedulerOutput(**copies)
    for rid, (prompt, computed, n) in chunks.items():
        req = _request(rid, prompt, computed)
        so.requests[rid] = req
        so.num_scheduled_tokens[rid] = n
        if computed + n == prompt:
            so.num_samples[rid] = 1
    so.total_num_scheduled_tokens = sum(so.num_scheduled_tokens.values())
    return so


@pytest.fixture
def executor() -> SimExecutor:
    # eager: host and GPU work add up, so every priced piece shows in the duration
    ex = SimExecutor(gpu="a100-80g", model="llama-2-7b", stack="eager")
    config = EngineConfig(block_size=16)
    ex.initialize_cache(config, ex.determine_capacity(config))
    return ex


def test_execute_costs_the_batch_the_scheduler_formed(executor: SimExecutor) -> None:
    so = _output({"a": (1000, 999, 1), "b": (501, 500, 1), "c": (2000, 512, 512)})
    out = executor.execute(so)
    expected = executor.cost_model.step_seconds(514, 2, 3, 2, 1000 + 501, [(512, 512)])
    assert out.duration_s == expected
    assert set(out.sampled_token_ids) == {"a", "b"}
    assert all(len(v) == 1 for v in out.sampled_token_ids.values())


def test_tokens_are_deterministic_per_request_and_position_and_never_eos() -> None:
    one, two = SimExecutor(model="llama-2-7b"), SimExecutor(model="llama-2-7b")
    req = _request("r1", 10, 9, stop=(500, 501))
    tokens = [one.sampled_token(req, p) for p in range(10, 2000)]
    assert tokens == [two.sampled_token(req, p) for p in range(10, 2000)]
    assert len(set(tokens)) > 1500  # spread over the vocabulary
    assert not {2, 500, 501} & set(tokens)
    assert all(100 <= t < 32000 for t in tokens)
    other = _request("r2", 10, 9)
    assert [one.sampled_token(other, p) for p in range(10, 50)] != tokens[:40]
    assert one.sampled_token(req, 10, 0) != one.sampled_token(req, 10, 1)


def test_execute_tokens_match_sampled_token(executor: SimExecutor) -> None:
    so = _output({"x": (300, 299, 1)})
    out = executor.execute(so)
    assert out.sampled_token_ids["x"] == [executor.sampled_token(so.requests["x"], 300)]


def test_n_samples_at_the_end_of_a_prompt(executor: SimExecutor) -> None:
    so = _output({"p": (64, 0, 64)})
    so.num_samples["p"] = 3
    tokens = executor.execute(so).sampled_token_ids["p"]
    assert len(tokens) == 3 and len(set(tokens)) == 3


def test_swaps_and_copies_cost_time(executor: SimExecutor) -> None:
    chunks = {"a": (1000, 999, 1)}
    base = executor.execute(_output(chunks)).duration_s
    swapped = executor.execute(_output(chunks, swap_out=[(1, 1), (2, 2)], swap_in=[(3, 3)]))
    copied = executor.execute(_output(chunks, copy_on_write=[(4, 5)]))
    assert swapped.duration_s == pytest.approx(base + executor.cost_model.swap_seconds(3))
    assert copied.duration_s == pytest.approx(base + executor.cost_model.copy_on_write_seconds(1))


def test_block_size_from_the_config_reaches_the_cost_model() -> None:
    ex = SimExecutor(gpu="h100", model="llama-2-7b", stack="eager")
    times = {}
    for bs in (8, 32):
        config = EngineConfig(block_size=bs)
        ex.initialize_cache(config, ex.determine_capacity(config))
        times[bs] = ex.execute(_output({"a": (4000, 3999, 1)})).duration_s
    assert times[8] > times[32]


def test_unknown_names_and_bad_tp_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="known GPUs"):
        SimExecutor(gpu="tpu-v5")
    with pytest.raises(ValueError, match="known models"):
        SimExecutor(model="gpt-5")
    with pytest.raises(ValueError, match="divide"):
        SimExecutor(model="llama-2-7b", tp=3)


def test_the_simulated_path_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "from slotune.engine.sim import SimExecutor, CostModel\n"
        "from slotune.engine.config import EngineConfig\n"
        "ex = SimExecutor(gpu='h100', model='llama-3-8b')\n"
        "c = EngineConfig()\n"
        "ex.initialize_cache(c, ex.determine_capacity(c))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'numpy' not in sys.modules, 'numpy was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_execute_steps_around_a_stop_token(executor: SimExecutor) -> None:
    plain = executor.execute(_output({"s": (300, 299, 1)})).sampled_token_ids["s"][0]
    so = SchedulerOutput()
    req = _request("s", 300, 299, stop=(plain,))
    so.requests["s"], so.num_scheduled_tokens["s"], so.num_samples["s"] = req, 1, 1
    so.total_num_scheduled_tokens = 1
    fresh = SimExecutor(gpu="a100-80g", model="llama-2-7b")
    token = fresh.execute(so).sampled_token_ids["s"][0]
    assert token != plain
    assert token == fresh.sampled_token(req, 300)


def test_bulk_tokens_equal_one_by_one() -> None:
    ex = SimExecutor(model="llama-2-7b")
    req = _request("bulk", 10, 9, stop=tuple(range(100, 32000, 3)))
    assert ex.sampled_tokens(req, 10, 300) == [ex.sampled_token(req, p) for p in range(10, 310)]
    assert not set(ex.sampled_tokens(req, 10, 300)) & set(range(100, 32000, 3))
