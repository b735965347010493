"""benchmarks/vidur_side.py: preparing Vidur from a checkout and running sim_speed's Vidur
cases, against a stand-in checkout whose command line is Vidur's flat-config parser for
the flags these cases need (Vidur itself needs its profiling data, which is not here)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"

# Vidur's flags (``vidur/config/config.py`` of the version its README runs, flattened by
# ``flat_dataclass.py``: a nested config's fields as ``<snake class name>_<field>``, a
# polymorphic one's kind as ``<field>_type``) that the stand-in accepts; any other flag is
# an error, as in Vidur
VIDUR_FLAGS = [
    "replica_config_device",
    "replica_config_network_device",
    "replica_config_model_name",
    "replica_config_tensor_parallel_size",
    "replica_config_num_pipeline_stages",
    "replica_config_memory_margin_fraction",
    "cluster_config_num_replicas",
    "request_generator_config_type",
    "synthetic_request_generator_config_num_requests",
    "length_generator_config_type",
    "trace_request_length_generator_config_trace_file",
    "trace_request_length_generator_config_max_tokens",
    "interval_generator_config_type",
    "poisson_request_interval_generator_config_qps",
    "replica_scheduler_config_type",
    "sarathi_scheduler_config_chunk_size",
    "sarathi_scheduler_config_batch_size_cap",
    "sarathi_scheduler_config_block_size",
    "random_forrest_execution_time_predictor_config_prediction_max_prefill_chunk_size",
    "random_forrest_execution_time_predictor_config_prediction_max_batch_size",
    "random_forrest_execution_time_predictor_config_prediction_max_tokens_per_request",
    "metrics_config_output_dir",
]

STAND_IN = """
import argparse, csv, json, sys
from pathlib import Path
parser = argparse.ArgumentParser()
for flag in {flags!r}:
    parser.add_argument("--" + flag)
args = parser.parse_args()
with open(args.trace_request_length_generator_config_trace_file) as f:
    rows = list(csv.DictReader(f))
with open("runs.jsonl", "a") as f:
    f.write(json.dumps({{**vars(args), "rows": rows}}) + "\\n")
"""


@pytest.fixture
def side(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("vidur_side", BENCHMARKS / "vidur_side.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def snapshot(root: Path, flags: list[str], profiles: list[str]) -> Path:
    (root / "vidur").mkdir(parents=True)
    (root / "vidur" / "__init__.py").write_text("")
    (root / "vidur" / "main.py").write_text(STAND_IN.format(flags=flags))
    (root / "requirements.txt").write_text("pip\n")  # installed already: nothing fetched
    for path in profiles:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("stand-in\n")
    return root


def azure(path: Path, rows: list[tuple[int, int]]) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:15:{i:02d}.0000000,{c},{g}" for i, (c, g) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def all_profiles(side) -> list[str]:
    return [f for case in side.VIDUR for f in side.profiling_files(case)]


def test_prepare_installs_checks_and_warms_both_cases(side, tmp_path):
    snap = snapshot(tmp_path / "vidur", VIDUR_FLAGS, all_profiles(side))
    rows = [(1200, 130), (14000, 2000), (37, 1)] * 80
    side.prepare(snap, tmp_path / "home", sys.executable, azure(tmp_path / "a.csv", rows))
    state = json.loads((tmp_path / "home" / "prepared.json").read_text())
    assert Path(state["python"]).parent.parent == tmp_path / "home" / "venv"
    runs = [json.loads(line) for line in (snap / "runs.jsonl").read_text().splitlines()]
    assert [
        (r["replica_config_model_name"], r["replica_config_tensor_parallel_size"]) for r in runs
    ] == [
        ("meta-llama/Llama-2-7b-hf", "1"),
        ("meta-llama/Llama-2-70b-hf", "2"),
    ]
    for run in runs:  # the file's first 200 requests, their lengths as they were
        assert run["synthetic_request_generator_config_num_requests"] == "200"
        got = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in run["rows"]]
        assert got == rows[:200]
        assert run["sarathi_scheduler_config_chunk_size"] == "512"
        assert run["poisson_request_interval_generator_config_qps"] == "5.0"
        assert int(run["trace_request_length_generator_config_max_tokens"]) >= 16000


def test_prepare_refuses_a_vidur_whose_command_line_lacks_a_flag(side, tmp_path):
    flags = [f for f in VIDUR_FLAGS if f != "sarathi_scheduler_config_chunk_size"]
    snap = snapshot(tmp_path / "vidur", flags, all_profiles(side))
    with pytest.raises(SystemExit, match="--sarathi_scheduler_config_chunk_size"):
        side.prepare(snap, tmp_path / "home", sys.executable, azure(tmp_path / "a.csv", [(9, 9)]))
    assert not (tmp_path / "home" / "prepared.json").exists()
    assert not (snap / "runs.jsonl").exists()


def test_prepare_refuses_a_snapshot_without_profiling_data(side, tmp_path):
    profiles = [f for f in all_profiles(side) if "70b" not in f or "attention" not in f]
    snap = snapshot(tmp_path / "vidur", VIDUR_FLAGS, profiles)
    with pytest.raises(SystemExit, match=r"Llama-2-70b-hf/attention\.csv"):
        side.prepare(snap, tmp_path / "home", sys.executable, azure(tmp_path / "a.csv", [(9, 9)]))
    assert not (tmp_path / "home").exists()


def test_sim_speed_skips_vidur_where_none_is_prepared_and_runs_it_where_it_is(side, tmp_path):
    snap = snapshot(tmp_path / "vidur", VIDUR_FLAGS, all_profiles(side))
    trace = azure(tmp_path / "a.csv", [(300, 20), (800, 40)] * 20)
    cmd = [sys.executable, str(BENCHMARKS / "sim_speed.py"), "--requests", "30", "--csv"]
    cmd += [str(trace), "--cases", "whole-azure", "vidur-azure"]
    env = {**os.environ, "SLOTUNE_VIDUR": str(tmp_path / "home")}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    assert "skipped vidur-azure: no Vidur prepared" in out
    assert "| vidur-azure |" not in out

    side.prepare(snap, tmp_path / "home", sys.executable, trace)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    assert "| vidur-azure | cpu_s |" in out
    assert "this: vidur-azure / whole-azure, CPU seconds" in out
    last = json.loads((snap / "runs.jsonl").read_text().splitlines()[-1])
    assert last["synthetic_request_generator_config_num_requests"] == "30"
    assert len(last["rows"]) == 30


def test_a_warm_up_that_fails_leaves_nothing_marked_prepared(side, tmp_path):
    snap = snapshot(tmp_path / "vidur", VIDUR_FLAGS, all_profiles(side))
    main = snap / "vidur" / "main.py"
    main.write_text(main.read_text() + "sys.exit('no attention profile for this shape')\n")
    with pytest.raises(subprocess.CalledProcessError):
        side.prepare(snap, tmp_path / "home", sys.executable, azure(tmp_path / "a.csv", [(9, 9)]))
    assert (snap / "runs.jsonl").exists()  # it did run
    assert not (tmp_path / "home" / "prepared.json").exists()
