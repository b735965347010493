"""Vidur beside ``benchmarks/sim_speed.py``: prepare it from its public snapshot, and the
command that replays sim_speed's whole-process cases in it.

    .venv/bin/python benchmarks/vidur_side.py prepare --snapshot ~/src/vidur
    .venv/bin/python benchmarks/sim_speed.py --cases whole-azure vidur-azure --repeats 3

``prepare`` takes a checkout of Microsoft's Vidur (github.com/microsoft/vidur: the
``vidur`` package, ``requirements.txt`` and the ``data/profiling`` files, which are in the
repository only, not in the ``vidur`` wheel on PyPI), makes a virtualenv for it under
``--home`` (default ``$SLOTUNE_VIDUR`` or ``<tmp>/slotune-vidur``) with Python 3.10 where
there is one (Vidur's README asks for it), installs its requirements there, checks that its
command line knows every flag these cases pass (Vidur's flags have changed between
versions) and that the profiling files of both cases are there, and runs each case once on
200 requests so that Vidur's trained predictors are cached (``cache/`` in the snapshot)
before anything is timed. sim_speed skips the Vidur cases, saying why, where nothing was
prepared.

The cases match sim_speed's ``whole-azure`` and ``whole-overload``: the same Azure-format
file (its first ``--requests`` rows, their context and generated token counts; Vidur
shuffles them with its seed), Poisson arrivals at 5 req/s, llama-2-7b on one A100 and
llama-2-70b on two with tensor parallelism, chunked prefill with 512-token chunks (Vidur's
``sarathi`` scheduler: vLLM V1's budget of 512), 256 sequences at most, blocks of 16 and
0.9 of the GPU's memory. Vidur writes its default metrics and plots, as it does when run
by hand.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sim_speed import BUDGET, VIDUR, WHOLE_RATE, model_of

from slotune.engine.config import EngineConfig
from slotune.tuner.export import hf_model_name

DEFAULTS = EngineConfig()  # what the slotune cases run, the budget aside
MAX_TOKENS = 16384  # above the Azure-like file's longest request (14,000 + 2,000 tokens)
DEVICE, NETWORK = "a100", "a100_pairwise_nvlink"  # Vidur's own default network for an A100
PREDICTOR = "random_forrest_execution_time_predictor_config"  # Vidur's default, as it spells it
PREPARED = "prepared.json"


def home() -> Path:
    return Path(os.environ.get("SLOTUNE_VIDUR") or Path(tempfile.gettempdir()) / "slotune-vidur")


def command(case: str, lengths: Path, num_requests: int, output_dir: Path) -> list[str]:
    """Vidur's arguments (after ``python -m vidur.main``) for one of ``sim_speed.VIDUR``,
    on the model and tensor parallelism of its slotune twin."""
    model, tp = model_of(VIDUR[case])
    flags = {
        "replica_config_device": DEVICE,
        "replica_config_network_device": NETWORK,
        "replica_config_model_name": hf_model_name(model),
        "replica_config_tensor_parallel_size": tp,
        "replica_config_num_pipeline_stages": 1,
        "replica_config_memory_margin_fraction": round(1 - DEFAULTS.gpu_memory_utilization, 6),
        "cluster_config_num_replicas": 1,
        "request_generator_config_type": "synthetic",
        "synthetic_request_generator_config_num_requests": num_requests,
        "length_generator_config_type": "trace",
        "trace_request_length_generator_config_trace_file": lengths,
        "trace_request_length_generator_config_max_tokens": MAX_TOKENS,
        "interval_generator_config_type": "poisson",
        "poisson_request_interval_generator_config_qps": WHOLE_RATE,
        "replica_scheduler_config_type": "sarathi",
        "sarathi_scheduler_config_chunk_size": BUDGET,
        "sarathi_scheduler_config_batch_size_cap": DEFAULTS.max_num_seqs,
        "sarathi_scheduler_config_block_size": DEFAULTS.block_size,
        f"{PREDICTOR}_prediction_max_prefill_chunk_size": MAX_TOKENS,
        f"{PREDICTOR}_prediction_max_batch_size": DEFAULTS.max_num_seqs,
        f"{PREDICTOR}_prediction_max_tokens_per_request": MAX_TOKENS,
        "metrics_config_output_dir": output_dir,
    }
    return [part for name, value in flags.items() for part in (f"--{name}", str(value))]


def profiling_files(case: str) -> list[str]:
    """The snapshot's profiling files a case reads (Vidur's default paths)."""
    model, _ = model_of(VIDUR[case])
    compute = f"data/profiling/compute/{DEVICE}/{hf_model_name(model)}"
    network = f"data/profiling/network/{NETWORK}"
    return [
        f"{compute}/mlp.csv",
        f"{compute}/attention.csv",
        f"{network}/all_reduce.csv",
        f"{network}/send_recv.csv",
    ]


def write_lengths(azure_csv: Path, num_requests: int, out: Path) -> Path:
    """The first ``num_requests`` rows of an Azure-format file as Vidur's length trace."""
    with (
        open(azure_csv, newline="", encoding="utf-8") as f,
        open(out, "w", newline="", encoding="utf-8") as g,
    ):
        rows = csv.DictReader(f)
        w = csv.writer(g)
        w.writerow(["num_prefill_tokens", "num_decode_tokens"])
        for n, row in enumerate(rows):
            if n == num_requests:
                break
            w.writerow([int(row["ContextTokens"]), int(row["GeneratedTokens"])])
    return out


def prepared(where: Path | None = None) -> tuple[dict | None, str]:
    """The prepared Vidur under ``where`` (default ``home()``), or None and why not."""
    where = where or home()
    marker = where / PREPARED
    if not marker.exists():
        return None, (
            f"no Vidur prepared in {where}: run benchmarks/vidur_side.py prepare --snapshot "
            "<a checkout of github.com/microsoft/vidur> (or set SLOTUNE_VIDUR)"
        )
    return json.loads(marker.read_text()), ""


def process(
    case: str, azure_csv: Path, num_requests: int, where: Path | None = None
) -> tuple[list[str], Path]:
    """The whole Vidur process of ``case`` (its command, and the folder it runs in)."""
    state, why = prepared(where)
    if state is None:
        raise RuntimeError(why)
    return _process(state, case, azure_csv, num_requests)


def _process(state: dict, case: str, azure_csv: Path, num_requests: int) -> tuple[list[str], Path]:
    work = Path(state["home"])
    lengths = write_lengths(azure_csv, num_requests, work / f"lengths-{num_requests}.csv")
    args = command(case, lengths, num_requests, work / "output")
    return [state["python"], "-m", "vidur.main", *args], Path(state["snapshot"])


def _python(explicit: str | None) -> str:
    return explicit or shutil.which("python3.10") or sys.executable


def prepare(snapshot: Path, where: Path, python: str | None, azure_csv: Path) -> None:
    snapshot = snapshot.resolve()
    for need in ("vidur/main.py", "requirements.txt"):
        if not (snapshot / need).exists():
            sys.exit(f"{snapshot}: no {need}; give a checkout of github.com/microsoft/vidur")
    files = dict.fromkeys(f for case in VIDUR for f in profiling_files(case))
    missing = [f for f in files if not (snapshot / f).exists()]
    if missing:
        sys.exit(f"{snapshot}: the snapshot lacks profiling data: {', '.join(missing)}")
    where.mkdir(parents=True, exist_ok=True)
    venv = where / "venv"
    subprocess.run([_python(python), "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "-r", str(snapshot / "requirements.txt")], check=True)
    helped = subprocess.run(
        [py, "-m", "vidur.main", "--help"], cwd=snapshot, capture_output=True, text=True
    )
    if helped.returncode:
        sys.exit(f"{snapshot}: python -m vidur.main --help failed:\n{helped.stderr[-2000:]}")
    known = {word.strip("[]") for word in helped.stdout.split()}
    flags = [a for case in VIDUR for a in command(case, Path("x"), 1, where) if a[:2] == "--"]
    unknown = sorted(set(flags) - known)
    if unknown:
        sys.exit(f"this Vidur's command line lacks {', '.join(unknown)}: another version?")
    state = {"home": str(where), "python": py, "snapshot": str(snapshot)}
    for case in VIDUR:  # trains and caches the predictors before anything is timed
        cmd, cwd = _process(state, case, azure_csv, 200)
        subprocess.run(cmd, cwd=cwd, check=True)
    (where / PREPARED).write_text(json.dumps(state, indent=1))  # only once all of it ran
    print(f"Vidur prepared in {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("prepare", help="a virtualenv for a Vidur checkout, its cache warmed")
    p.add_argument("--snapshot", type=Path, required=True, help="a checkout of microsoft/vidur")
    p.add_argument("--home", type=Path, default=None, help="where to keep it (SLOTUNE_VIDUR)")
    p.add_argument("--python", help="the interpreter for its virtualenv (default python3.10)")
    args = parser.parse_args()
    from sim_speed import write_azure_csv

    azure = write_azure_csv(Path(tempfile.gettempdir()) / "slotune-azure-like-200.csv", 200)
    prepare(args.snapshot, args.home or home(), args.python, azure)


if __name__ == "__main__":
    main()
