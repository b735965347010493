from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slotune.calibration.measure import Measurement, default_grid
from slotune.calibration.step_fit import build_profile, fit, predict
from slotune.cli.app import app
from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine.sim import GpuSpec, get_model, load_profile


@pytest.mark.slow
def test_calibrate_cli_writes_a_profile_the_simulator_accepts(
    tiny_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "profile.json"
    args = ["calibrate", "--model", str(tiny_dir), "--device", "cpu", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--threads", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["spec"]["hbm_gbps"] > 0 and len(data["calibration"]) > 20
    profile = load_profile(str(out))
    assert profile.gpu.name == "calibrated-cpu"

    engine = Engine.simulated(
        EngineConfig(num_gpu_blocks=64), gpu=str(out), model=str(tiny_dir / "config.json")
    )
    engine.add_request("r", [5] * 40, SamplingParams(max_tokens=3, ignore_eos=True))
    durations = []
    while engine.has_unfinished_requests():
        engine.step()
        durations.append(engine.last_step.duration_s)
    assert all(d > 0 for d in durations)


def test_fit_recovers_step_times_of_a_known_profile(tiny_dir: Path) -> None:
    """Step times made by a known profile are fitted back closely (no timing involved)."""
    spec = GpuSpec("test-cpu", "test", 16, 20.0, 0.1, None, 20.0, 20.0, "none", "test")
    truth = dict(_PARAMS_TRUTH)
    model = get_model(str(tiny_dir / "config.json"))
    shapes = default_grid()
    times = predict(build_profile(spec, truth, 16), model, 16, shapes)
    measured = [Measurement(s, t) for s, t in zip(shapes, times, strict=True)]
    fitted = predict(build_profile(spec, fit(spec, model, 16, measured), 16), model, 16, shapes)
    errors = [abs(f - t) / t for f, t in zip(fitted, times, strict=True)]
    assert max(errors) < 0.05


_PARAMS_TRUTH = {
    "linear_overhead_us": 30.0,
    "linear_mem_eff": 0.4,
    "linear_compute_eff": 0.6,
    "linear_half_tokens": 4.0,
    "elementwise_overhead_us": 8.0,
    "elementwise_eff": 0.5,
    "prefill_overhead_us": 100.0,
    "prefill_prefix_eff": 0.1,
    "prefill_causal_eff": 0.05,
    "decode_overhead_us": 50.0,
    "decode_per_seq_us": 20.0,
    "decode_eff": 0.3,
    "cpu_step_us": 500.0,
    "cpu_per_request_us": 30.0,
    "decode_per_call_us": 40.0,
    "decode_call_ranges": 3.0,
    "prefill_per_chunk_us": 25.0,
}


def test_calibrate_rejects_a_folder_without_a_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", "--model", str(tmp_path)])
    assert result.exit_code == 2
    assert "config.json" in result.output


def test_grid_decode_batches_mix_context_lengths_as_served_batches_do() -> None:
    """A served batch mixes lengths, and the reference attention runs one call per group of
    similar contexts: a grid batch of one length would time a single call and price served
    decode steps too cheap."""
    from slotune.calibration.measure import CONTEXT_RATIO, spread_contexts
    from slotune.engine.model.attention.torch_backend import _by_context

    batches = [s.decodes for s in default_grid() if len(s.decodes) > 1]
    assert batches
    for ctx in batches:
        assert max(ctx) / min(ctx) == pytest.approx(CONTEXT_RATIO, rel=0.2)
    ctx = spread_contexts(256, 16)
    assert sum(ctx) / len(ctx) == pytest.approx(256, rel=0.02)
    assert len(_by_context(list(range(16)), ctx)) >= 6
    assert len(_by_context(list(range(16)), (256,) * 16)) == 1


def test_recorded_steps_are_timed_warm(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's first run of its token count costs a second more here (as a first cuBLAS
    call per shape does, in little): the calibration's timed engine steps must not see it."""
    from dataclasses import replace

    from slotune.calibration.on_device import calibrate
    from slotune.engine.model.executor import TorchExecutor

    seen: set[int] = set()
    execute = TorchExecutor.execute

    def first_use_costs_more(self: TorchExecutor, so):  # type: ignore[no-untyped-def]
        out = execute(self, so)
        cold = so.total_num_scheduled_tokens not in seen
        seen.add(so.total_num_scheduled_tokens)
        return replace(out, duration_s=out.duration_s + 1.0) if cold else out

    monkeypatch.setattr(TorchExecutor, "execute", first_use_costs_more)
    result = calibrate(tiny_dir, device="cpu", grid=default_grid()[:4], threads=1)
    steps = [m.seconds for m in result.measurements if m.source == "workload"]
    assert len(steps) > 100
    assert max(steps) < 0.5


def test_recorded_runs_hold_a_served_number_of_requests(tiny_dir: Path) -> None:
    """A recorded run keeps ``in_flight`` requests in the engine, a new one joining as one
    finishes (not all at once, whose contexts grow in step), and still runs them all."""
    from slotune.calibration.measure import record_workload
    from slotune.calibration.on_device import calibration_executor

    executor = calibration_executor(tiny_dir, default_grid()[:2], "cpu", threads=1)
    seen: set[str] = set()
    most = 0
    execute = executor.execute

    def counting(so):  # type: ignore[no-untyped-def]
        nonlocal most
        seen.update(so.num_scheduled_tokens)
        most = max(most, len(so.requests))
        return execute(so)

    executor.execute = counting  # type: ignore[method-assign]
    run = record_workload(executor, 16, 512, num_requests=12, in_flight=4)
    assert len(seen) == 12 and most == 4
    assert len(run.measurements) > 12
