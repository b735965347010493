"""KV-cache dtype on a simulated H100: capacity, decode step time, and what the tuner
recommends on the bundled ``long-context`` trace (llama-3-8b, 1 GPU).

    PYTHONPATH=. .venv/bin/python benchmarks/kv_dtype_h100.py            # ~1 minute
    PYTHONPATH=. .venv/bin/python benchmarks/kv_dtype_h100.py --trials 20

1. Capacity: KV blocks (16 tokens) of vLLM's default configuration for each
   ``kv_cache_dtype``, from ``determine_capacity``.
2. Decode step time: a pure-decode step of 32 and of 100 requests at 4,096 tokens of
   context each (the trace's prompts average 3.9k; 100 such requests nearly fill the bf16
   pool), and the attention share of the larger one.
3. The tuner: ``slotune tune`` (goodput objective, SLO ttft=2s,tpot=50ms, seed 0) with
   the KV dtype fixed to each value by a ``--search`` file, and once with the default space,
   which on an H100 searches auto and fp8 (the formats vLLM and SGLang serve).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from slotune.engine.config import EngineConfig
from slotune.engine.sim import CostModel, determine_capacity, get_model, load_profile

GPU, MODEL, TRACE, SLO = "h100", "llama-3-8b", "long-context", "ttft=2s,tpot=50ms"
KV_DTYPES = ("auto", "fp8", "int8", "int4")
MAX_MODEL_LEN = 7191  # the trace's longest request, as tune and bench set it


def capacity_rows() -> list[tuple[str, int, float]]:
    profile, model = load_profile(GPU), get_model(MODEL)
    rows = []
    for kv in KV_DTYPES:
        config = EngineConfig(kv_cache_dtype=kv, max_model_len=MAX_MODEL_LEN)
        blocks = determine_capacity(profile, model, 1, config).num_gpu_blocks
        rows.append((kv, blocks, blocks * config.block_size / 1e3))
    return rows


def decode_rows() -> list[tuple[str, float, float, float]]:
    profile, model = load_profile(GPU), get_model(MODEL)
    rows = []
    for kv in KV_DTYPES:
        cm = CostModel(profile, model, kv_cache_dtype=kv)
        small, large = (cm.decode_step_seconds(b, b * 4096) * 1e3 for b in (32, 100))
        attention = cm.breakdown(0, 0, 100, 4096).per_layer["attention"] * model.num_layers
        rows.append((kv, small, large, attention * 1e3 / large))
    return rows


def tune(trials: int, kv: str | None, out: Path) -> dict:  # type: ignore[type-arg]
    args = ["tune", "--gpu", GPU, "--model", MODEL, "--trace", TRACE, "--slo", SLO]
    args += ["--trials", str(trials), "--seed", "0", "--out", str(out)]
    if kv is not None:
        search = out.with_suffix(".yaml")
        search.write_text(f"kv_cache_dtype: {kv}\n")
        args += ["--search", str(search)]
    code = "import sys; from slotune.cli.app import main; sys.argv[0] = 'slotune'; main()"
    subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True)
    return json.loads((out / "best.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    print(f"## Capacity ({MODEL} on 1 x {GPU}, vLLM defaults, blocks of 16)\n")
    print("| kv_cache_dtype | KV blocks | tokens (k) | x auto |\n|---|---:|---:|---:|")
    caps = capacity_rows()
    for kv, blocks, tokens in caps:
        print(f"| {kv} | {blocks} | {tokens:.0f} | {blocks / caps[0][1]:.2f} |")
    print("\n## Decode step (context 4,096 per request)\n")
    print("| kv_cache_dtype | 32 requests (ms) | 100 requests (ms) | attention share at 100 |")
    print("|---|---:|---:|---:|")
    for kv, small, large, share in decode_rows():
        print(f"| {kv} | {small:.2f} | {large:.2f} | {share:.0%} |")
    print(f"\n## Tuner on {TRACE} (goodput, SLO {SLO}, {args.trials} trials, seed 0)\n")
    print(
        "| KV dtype in the space | recommended: kv, budget / max_num_seqs / block "
        "| goodput (req/s) | vLLM defaults (req/s) |"
    )
    print("| --- | --- | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for kv in (*KV_DTYPES, None):
            best = tune(args.trials, kv, Path(tmp) / (kv or "default"))
            c = best["config"]
            knobs = f"{c['max_num_batched_tokens']} / {c['max_num_seqs']} / {c['block_size']}"
            label = kv or "default (auto, fp8)"
            print(
                f"| {label} | {c['kv_cache_dtype']}: {knobs} | {best['goodput_rps']:.2f} | "
                f"{best['baseline']['goodput_rps']:.2f} |"
            )


if __name__ == "__main__":
    main()
