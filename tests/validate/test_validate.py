"""`slotune validate` and `calibrate --from-runs` on small runs whose answer is known."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from slotune.calibration.from_runs import Param, fit_from_runs
from slotune.cli.app import app
from slotune.engine.config import EngineConfig
from slotune.engine.sim import CostModel, get_model, load_profile
from slotune.engine.sim.stack import StackProfile
from slotune.validate import load_run, overall, replay, run_row
from slotune.validate.runs import MeasuredRun, RunFormatError, ServerSettings
from slotune.workloads.arrivals import ArrivalSpec
from slotune.workloads.runner.engine_loop import run_simulated
from slotune.workloads.trace import Trace, TraceRequest

STACK = StackProfile(name="test", host_step_us=100.0, request_in_us=2000.0, request_out_us=500.0)
PROMPT, OUTPUT = 200, 5


def _write_run(folder: Path, measured_ttft: float, measured_e2e: float) -> Path:
    """Three requests 10 s apart, in the layout of the sim-to-real study."""
    folder.mkdir(parents=True)
    config = {
        "tensor_parallelism": 1,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
        "kv_blocks_total_gpu": 5000,
        "block_size": 16,
    }
    rows = [
        {
            "index": i,
            "arrival_time_us": 10_000_000 * i,
            "input_tokens": PROMPT,
            "output_tokens": 3,
            "has_error": False,
        }
        for i in range(3)
    ]
    (folder / "requests.json").write_text(
        json.dumps({"model_id": "meta-llama/Llama-2-7b-hf", "config": config, "requests": rows})
    )
    (folder / "measured.json").write_text(
        json.dumps(
            [
                {"index": i, "ttft_s": measured_ttft, "e2e_s": measured_e2e, "has_error": False}
                for i in range(3)
            ]
        )
    )
    (folder / "profile.json").write_text(
        json.dumps(
            {
                "data": {"shared_prefix": {"output_len": OUTPUT}},
                "load": {"stages": [{"rate": 0.1, "duration": 30}]},
            }
        )
    )
    return folder


def _by_hand() -> tuple[float, float]:
    """An isolated request: one prefill step, then OUTPUT - 1 decode steps, plus the
    stack's time outside the engine."""
    cm = CostModel(load_profile("h100"), get_model("llama-2-7b"), stack=STACK, max_num_seqs=64)
    prefill = cm.step_seconds(PROMPT, 1, 1, prefill_chunks=[(PROMPT, 0)])
    decodes = sum(cm.decode_step_seconds(1, PROMPT + k) for k in range(1, OUTPUT))
    ttft = STACK.request_latency_s + prefill
    return ttft, ttft + decodes


def test_validate_errors_match_a_hand_computed_run(tmp_path: Path) -> None:
    ttft, e2e = _by_hand()
    run = load_run(_write_run(tmp_path / "run", 2 * ttft, 1.25 * e2e), model="llama-2-7b")
    assert run.output_lens.tolist() == [OUTPUT] * 3  # output_len of the profile, not the client's
    row = run_row(replay(run, stack=STACK))
    assert row["ttft_mean_pred"] == pytest.approx(ttft, rel=1e-9)
    assert row["e2e_mean_pred"] == pytest.approx(e2e, rel=1e-9)
    assert row["ttft_mean_err"] == pytest.approx(-0.5, rel=1e-9)
    assert row["e2e_mean_err"] == pytest.approx(0.8 - 1, rel=1e-9)
    itl_pred, itl_meas = (e2e - ttft) / (OUTPUT - 1), (1.25 * e2e - 2 * ttft) / (OUTPUT - 1)
    assert row["itl_mean_err"] == pytest.approx(itl_pred / itl_meas - 1, rel=1e-9)
    assert not row["saturated"]
    total = overall([row, row])
    assert total["ttft_mean_mae_pct"] == pytest.approx(50.0)


def test_validate_command_prints_per_run_and_overall(tmp_path: Path) -> None:
    ttft, e2e = _by_hand()
    folder = _write_run(tmp_path / "run", ttft, e2e)
    stack_file = tmp_path / "stack.json"
    stack_file.write_text(json.dumps(STACK.to_dict()))
    res = CliRunner().invoke(
        app,
        ["validate", str(folder), "--model", "llama-2-7b", "--stack", str(stack_file), "--json"],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["runs"][0]["e2e_mean_err"] == pytest.approx(0.0, abs=1e-9)
    assert data["overall"]["e2e_mean_mae_pct"] == pytest.approx(0.0, abs=1e-6)
    table = CliRunner().invoke(app, ["validate", str(folder), "--model", "llama-2-7b"])
    assert table.exit_code == 0 and "mean absolute error" in table.output


def test_validate_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert res.exit_code == 2 and "not a measured run" in res.output
    with pytest.raises(RunFormatError, match=r"no config\.json in model_configs"):
        load_run(_write_run(tmp_path / "r", 0.1, 0.2))
    bad = _write_run(tmp_path / "b", 0.1, 0.2)
    (bad / "measured.json").write_text("{oops")
    with pytest.raises(RunFormatError, match=r"measured\.json: cannot read JSON"):
        load_run(bad, model="llama-2-7b")


def test_bench_output_replays_to_itself(tmp_path: Path) -> None:
    """A run written by `slotune bench --out` reads back as a measured run; replayed with
    the settings that made it, every error is zero."""
    out = tmp_path / "bench"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--trace",
            "sharegpt-like",
            "--num-requests",
            "40",
            "--rate",
            "8",
            "--gpu",
            "h100",
            "--model",
            "llama-2-7b",
            "--prefix-caching",
            "none",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    run = load_run(out)
    assert run.settings.model == "llama-2-7b" and len(run.trace) == 40
    row = run_row(replay(run))
    for m in ("ttft", "itl", "e2e"):
        assert row[f"{m}_mean_err"] == pytest.approx(0.0, abs=1e-9)


def _loaded_trace() -> Trace:
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(1 / 12.0, size=360))
    reqs = [
        TraceRequest(
            f"q{i}", prompt_len=int(rng.integers(300, 900)), output_len=60, arrival_time=float(a)
        )
        for i, a in enumerate(t)
    ]
    return Trace(name="loaded", requests=tuple(reqs))


@pytest.mark.parametrize(
    "decode_eff",
    [
        0.9234,
        pytest.param(
            0.9171,
            marks=pytest.mark.xfail(
                strict=True,
                reason="the least-squares search stalls at 527 us (cost 0.0069) with replays "
                "left; restarting it recovers the truth here but fits worse in "
                "cross-validation, so it is not shipped (BENCHMARKS, issue 25)",
            ),
        ),
    ],
)
def test_calibrate_recovers_the_constants_a_run_was_simulated_with(decode_eff: float) -> None:
    from dataclasses import replace

    from slotune.engine.sim.profile import load_profile

    h100 = load_profile("h100")
    profile = replace(h100, attention=replace(h100.attention, decode_eff=decode_eff))
    truth = StackProfile(name="truth", host_step_us=700.0, request_in_us=6000.0)
    trace = _loaded_trace()
    config = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=128, max_model_len=2048)
    result = run_simulated(
        config,
        trace,
        gpu=profile,
        model="llama-2-7b",
        stack=truth,
        arrivals=ArrivalSpec(timestamps=True),
    )
    df = result.requests
    run = MeasuredRun(
        name="synthetic",
        trace=trace,
        settings=ServerSettings(
            model="llama-2-7b", max_num_seqs=128, max_model_len=2048, prefix_caching="hash"
        ),
        ttft_s=(df["first_token_time"] - df["arrival_time"]).to_numpy(),
        e2e_s=(df["finish_time"] - df["arrival_time"]).to_numpy(),
        ok=np.ones(len(df), dtype=bool),
        stages=((0.0, 15.0), (15.0, 40.0)),
    )
    params = [Param("stack.host_step_us", 0.0, 3000.0), Param("stack.request_in_us", 0.0, 30000.0)]
    fit = fit_from_runs(
        [run],
        stack=StackProfile(name="start", host_step_us=200.0, request_in_us=1000.0),
        profile=profile,
        params=params,
        window_s=40.0,
        warmup_s=2.0,
        max_evaluations=120,
    )
    assert fit.values["stack.host_step_us"] == pytest.approx(700.0, rel=0.1)
    assert fit.values["stack.request_in_us"] == pytest.approx(6000.0, rel=0.1)


def test_prompt_pool_finds_the_generator_pool_and_its_out_of_order_sends() -> None:
    from slotune.validate.runs import prompt_pool

    rng = np.random.default_rng(3)
    pool = rng.integers(500, 530, size=20).tolist()
    lengths = [pool[k % 20] for k in range(400)]
    lengths[41], lengths[42] = lengths[42], lengths[41]  # two sends swapped
    slots = prompt_pool(lengths)
    assert all(pool[s] == n for s, n in zip(slots, lengths, strict=True))
    assert slots[:20] == list(range(20)) and slots[20:40] == list(range(20))
    # fresh prompts of one length are not a pool (equal lengths by chance), nor are
    # lengths that never repeat in order
    assert prompt_pool([512] * 300) == [-1] * 300
    assert prompt_pool(rng.integers(100, 4000, size=300).tolist()) == [-1] * 300


def test_repeated_prompts_of_a_run_hit_the_prefix_cache(tmp_path: Path) -> None:
    folder = _write_run(tmp_path / "run", 0.05, 0.1)
    rows = [
        {
            "index": i,
            "arrival_time_us": 200_000 * i,
            "input_tokens": (300, 317, 290)[i % 3],
            "output_tokens": 3,
        }
        for i in range(30)
    ]
    data = json.loads((folder / "requests.json").read_text())
    (folder / "requests.json").write_text(json.dumps({**data, "requests": rows}))
    (folder / "measured.json").write_text(
        json.dumps([{"index": i, "ttft_s": 0.05, "e2e_s": 0.1} for i in range(30)])
    )
    run = load_run(folder, model="llama-2-7b")
    result = run_simulated(
        EngineConfig(num_gpu_blocks=5000, max_num_seqs=64),
        run.trace,
        gpu="h100",
        model=run.settings.model,
        stack=STACK,
        arrivals=ArrivalSpec(timestamps=True),
    )
    cached = result.requests["cached_tokens"].to_numpy()
    assert (cached[:3] == 0).all()
    # every later send of a prompt finds all its full blocks cached
    assert (cached[3:] == [(n // 16) * 16 for n in (300, 317, 290) * 9]).all()


def test_schedule_ahead_starts_a_busy_engine_arrival_one_step_later() -> None:
    """A request that arrives while a step runs joins after the next step, not after the
    one it arrived in (the scheduler planned the next step already); one arriving at an
    idle engine starts at once."""
    reqs = (
        TraceRequest(request_id="a", prompt_len=2000, output_len=20, arrival_time=0.0),
        TraceRequest(request_id="b", prompt_len=50, output_len=5, arrival_time=0.002),
        TraceRequest(request_id="c", prompt_len=50, output_len=5, arrival_time=30.0),
    )
    runs = {}
    for ahead in (False, True):
        runs[ahead] = run_simulated(
            EngineConfig(num_gpu_blocks=5000),
            Trace(name="t", requests=reqs),
            gpu="h100",
            model="llama-2-7b",
            stack=STACK.with_values(schedule_ahead=ahead),
            arrivals=ArrivalSpec(timestamps=True),
        )
    latency = STACK.request_latency_s
    for ahead, run in runs.items():
        ends = run.steps["time"].to_numpy()
        first = run.requests["first_token_time"].to_numpy() - latency
        # b arrived during step 1 (a's prefill): synchronous, it runs in step 2; ahead, in 3
        assert first[1] == pytest.approx(ends[2 if ahead else 1])
        assert first[0] == pytest.approx(ends[0])
        # c arrived at an idle engine: its first step starts at its arrival
        k = int(np.searchsorted(ends, first[2] - 1e-12))
        assert ends[k] - run.steps["duration_s"][k] == pytest.approx(30.0)


def test_a_fit_on_a_bound_is_reported() -> None:
    from slotune.calibration.from_runs import FitResult, stack_param

    p = stack_param("host_exposed_us")
    inside = FitResult(StackProfile(), load_profile("h100"), {p.name: 1400.0}, 0.0, 1, (), (p,))
    on_low = FitResult(StackProfile(), load_profile("h100"), {p.name: p.low}, 0.0, 1, (), (p,))
    assert inside.at_bounds == []
    assert on_low.at_bounds and on_low.at_bounds[0].startswith("stack.host_exposed_us=")
