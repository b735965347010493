"""``slotune tune`` end to end on small simulated studies, resume, and export."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.engine.config import EngineConfig

runner = CliRunner()


@pytest.fixture(autouse=True)
def _check_stretches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every simulated engine replays its stretches step by step and compares."""
    monkeypatch.setenv("SLOTUNE_CHECK_STRETCHES", "1")


SMALL = ["tune", "--gpu", "h100", "--slo", "ttft=300ms,tpot=50ms", "--num-requests", "30"]


def tune(*args: str) -> str:
    result = runner.invoke(app, [*SMALL, *args])
    assert result.exit_code == 0, result.output
    return result.output


def load_study(out: Path) -> optuna.Study:
    best = json.loads((out / "best.json").read_text())
    return optuna.load_study(study_name=best["study_name"], storage=f"sqlite:///{out}/study.db")


def test_small_weighted_tune_writes_every_output_and_exports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    output = tune("--objective", "weighted", "--rate", "4", "--trials", "4", "--out", str(out))
    assert "Recommended vs vLLM 0.34 defaults" in output
    best = json.loads((out / "best.json").read_text())
    for key in (
        "config",
        "metrics",
        "objective",
        "objective_value",
        "slo",
        "gpu",
        "model",
        "tp",
        "trace",
        "baseline",
        "seed",
        "sampler",
        "study_name",
        "date",
        "slotune_version",
        "commands",
    ):
        assert key in best, key
    assert best["objective"] == "weighted" and best["trace"]["name"] == "sharegpt-like"
    assert best["trace"]["stats"]["requests"] == 30
    EngineConfig.from_dict(best["config"])
    assert best["baseline"]["config"]["max_num_batched_tokens"] == 8192
    assert best["target"] == "vllm==0.34" and best["headline"] in " ".join(output.split())
    command = best["commands"]["vllm==0.34"]
    assert command.startswith("vllm serve ") and "\n" not in command
    budget = command.split("--max-num-batched-tokens ")[1].split()[0]
    assert int(budget) == best["config"]["max_num_batched_tokens"]  # exported = recommended
    if best["keep_defaults"]:
        assert best["config"] == best["baseline"]["config"]
    else:
        assert best["noise"]["significant"] is True
    with open(out / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert {
        "number",
        "state",
        "value",
        "config_max_num_batched_tokens",
        "ttft_ms_p99",
        "slo_attainment",
        "user_attrs_feasible",
    } <= set(rows[0])
    for run in ("best", "baseline"):
        for name in ("summary.json", "requests.csv", "steps.csv"):
            assert (out / "runs" / run / name).is_file(), (run, name)
    summary = json.loads((out / "runs" / "best" / "summary.json").read_text())
    assert summary["config"] == best["config"] and summary["num_requests"] == 30
    # the baseline is the first trial, so the tuner never recommends worse than it
    study = load_study(out)
    first = study.trials[0]
    assert first.user_attrs.get("baseline") is True
    assert best["score"] <= best["baseline"]["score"] + 1e-9 or not first.user_attrs["feasible"]
    exported = runner.invoke(app, ["export", str(out / "best.json")])
    assert exported.exit_code == 0 and exported.output.strip() == command
    exported = runner.invoke(app, ["export", str(out / "best.json"), "--format", "sglang"])
    if best["config"]["prefix_caching"] == "hash":  # SGLang has a radix cache only
        assert exported.exit_code == 2 and "does not run prefix_caching=hash" in exported.output


def test_resume_continues_the_study_without_rerunning(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--objective", "weighted", "--rate", "4", "--out", str(out), "--study-name", "s"]
    tune(*args, "--trials", "3")
    before = {t.number: (t.datetime_start, t.user_attrs["config"]) for t in load_study(out).trials}
    output = tune(*args, "--trials", "5", "--resume")
    assert "Resuming study s (3 finished trials)" in output
    study = load_study(out)
    finished = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(finished) == 5
    for t in study.trials[:3]:
        assert (t.datetime_start, t.user_attrs["config"]) == before[t.number]
    again = runner.invoke(app, [*SMALL, *args, "--trials", "5"])
    assert again.exit_code == 2 and "already exists" in again.output
    other = runner.invoke(app, [*SMALL, *args, "--trials", "6", "--resume", "--rate", "9"])
    assert other.exit_code == 2 and "load.rate" in other.output


def test_goodput_is_the_default_without_timestamps_or_rate(tmp_path: Path) -> None:
    out = tmp_path / "out"
    output = tune("--trials", "3", "--out", str(out))
    assert "objective goodput" in output
    best = json.loads((out / "best.json").read_text())
    assert best["objective"] == "goodput"
    assert best["baseline"]["goodput_rps"] > 0
    assert best["goodput_rps"] >= best["baseline"]["goodput_rps"]
    study = load_study(out)
    start = best["baseline"]["goodput_rps"]
    for t in study.trials:
        probes = t.user_attrs["probes"]
        assert probes, "every trial records its rate probes"
        feasible = [r for r, a in probes if a >= 0.99]
        if t.user_attrs["goodput_rps"] is None:
            # missed at the best rate so far: one run, valued by its goodput there
            assert len(probes) == 1 and not feasible and probes[0][0] >= start
            assert t.value == pytest.approx(probes[0][0] * probes[0][1])
        else:
            assert t.user_attrs["goodput_rps"] == max(feasible) == t.value


def test_pareto_reports_the_front(tmp_path: Path) -> None:
    out = tmp_path / "out"
    tune("--objective", "pareto", "--trials", "4", "--out", str(out))
    best = json.loads((out / "best.json").read_text())
    assert best["sampler"] == "nsga2" and best["directions"] == ["maximize", "minimize"]
    front = best["pareto_front"]
    assert front and best["trial"] in {p["trial"] for p in front}
    for a in front:
        assert not any(
            b["goodput"] >= a["goodput"]
            and b["score"] <= a["score"]
            and (b["goodput"], b["score"]) != (a["goodput"], a["score"])
            for b in front
        )


def test_tuner_beats_a_clearly_bad_baseline(tmp_path: Path) -> None:
    """Long prompts on an A100: vLLM's 2048-token budget makes every decode wait behind
    long prefill chunks, so inter-token latency blows through a 50 ms SLO."""
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "tune",
            "--gpu",
            "a100-80g",
            "--trace",
            "long-context",
            "--num-requests",
            "40",
            "--rate",
            "2",
            "--slo",
            "ttft=2000ms,itl=50ms",
            "--objective",
            "weighted",
            "--trials",
            "10",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    best = json.loads((out / "best.json").read_text())
    assert best["baseline"]["score"] > 1.5
    assert best["score"] < 0.7 * best["baseline"]["score"]


def test_grid_sampler_runs_every_point_once(tmp_path: Path) -> None:
    search = tmp_path / "grid.yaml"
    search.write_text(
        "max_num_batched_tokens: [1024, 4096]\nmax_num_seqs: [64, 256]\n"
        "long_prefill_token_threshold: off\nblock_size: 16\npolicy: chunked\n"
        "preemption_mode: recompute\nprefix_caching: hash\nkv_cache_dtype: auto\n"
    )
    out = tmp_path / "out"
    output = tune(
        "--objective",
        "weighted",
        "--rate",
        "4",
        "--sampler",
        "grid",
        "--trials",
        "10",
        "--search",
        str(search),
        "--out",
        str(out),
    )
    assert "Grid: 4 configurations" in output
    trials = [t for t in load_study(out).trials if t.state.name == "COMPLETE"]
    points = {
        (t.user_attrs["config"]["max_num_batched_tokens"], t.user_attrs["config"]["max_num_seqs"])
        for t in trials
    }
    assert len(trials) == 4 and points == {(1024, 64), (1024, 256), (4096, 64), (4096, 256)}


def test_two_workers_on_sqlite_share_the_study(tmp_path: Path) -> None:
    out = tmp_path / "out"
    tune(
        "--objective",
        "weighted",
        "--rate",
        "4",
        "--trials",
        "4",
        "--n-jobs",
        "2",
        "--out",
        str(out),
    )
    trials = [t for t in load_study(out).trials if t.state.name == "COMPLETE"]
    # the budget is global: exactly 4 finished trials, whichever worker ran them
    assert len(trials) == 4
    assert {t.user_attrs["worker"] for t in trials} <= {0, 1}
    assert len({t.number for t in trials}) == 4


@pytest.fixture(autouse=True)
def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.slow
def test_ctrl_c_keeps_finished_trials_and_resume_continues(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    args = [
        sys.executable,
        "-c",
        "from slotune.cli.app import main; main()",
        *SMALL,
        "--objective",
        "weighted",
        "--rate",
        "4",
        "--study-name",
        "c",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [*args, "--trials", "500"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    storage = f"sqlite:///{out}/study.db"
    deadline = time.monotonic() + 60
    done = 0
    while done < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        try:
            study = optuna.load_study(study_name="c", storage=storage)
            done = sum(t.state.name == "COMPLETE" for t in study.trials)
        except Exception:  # the study (or its tables) may not exist yet
            done = 0
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "run the same command with --resume" in output and "Traceback" not in output
    kept = [
        t
        for t in optuna.load_study(study_name="c", storage=storage).trials
        if t.state.name == "COMPLETE"
    ]
    assert len(kept) >= 3
    before = {t.number: t.datetime_complete for t in kept}
    total = len(kept) + 2
    result = runner.invoke(app, [*args[3:], "--trials", str(total), "--resume"])
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name="c", storage=storage)
    finished = {t.number: t.datetime_complete for t in study.trials if t.state.name == "COMPLETE"}
    assert len(finished) == total
    assert all(finished[n] == when for n, when in before.items())
