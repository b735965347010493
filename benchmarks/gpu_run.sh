#!/usr/bin/env bash
# Every GPU check of this repository, as one run on a machine with a CUDA card (see
# docs/BENCHMARKS.md, "GPU"). Writes logs and JSON under ${OUT:-gpu-out}.
#   PYTHON=python3 bash benchmarks/gpu_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
py=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
"$py" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' \
    | tee -a "$out/gpu.txt"
# 1. Kernels: Triton (and flash-attn) against the torch backend; decode read against HBM.
timeout 120 "$py" benchmarks/gpu_check.py --out "$out/gpu_check.json" 2>&1 | tee "$out/gpu_check.log"
# 2. Simulator fidelity on the card: Poisson arrivals at 0.9 of capacity, budgets 64 and 512.
timeout 200 "$py" benchmarks/sim_fidelity.py --device cuda --threads 0 \
    --json "$out/fidelity_poisson.json" 2>&1 | tee "$out/fidelity_poisson.log"
# 3. Issue 25's closed-loop check (100 requests, 8 users, budget 512), on the card.
timeout 120 "$py" benchmarks/sim_fidelity.py --preset tiny --requests 100 --concurrency 8 \
    --budgets 512 --device cuda --threads 0 --real-runs 3 \
    --json "$out/fidelity_closed.json" 2>&1 | tee "$out/fidelity_closed.log"
# 4. As 2 with a fresh calibration right before each real run (drift against model error).
timeout 200 "$py" benchmarks/sim_fidelity.py --device cuda --threads 0 --calibrate-each \
    --json "$out/fidelity_each.json" 2>&1 | tee "$out/fidelity_each.log"
# 5. Llama GEMMs timed on the card against the shipped profiles (a check, never fitted).
timeout 120 "$py" benchmarks/kernel_reference.py --out "$out" --check h200 h100 \
    2>&1 | tee "$out/kernel_reference.log"
