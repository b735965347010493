#!/usr/bin/env bash
# Install the real serving engines' argument parsers and config builders into a separate
# virtualenv (default .venv-engines) for `make check-export`: CPU torch, slotune itself, and
# vLLM / SGLang wheels with --no-deps plus only the pure-Python packages their CLI parsers and
# config builders import. No CUDA runtime, no kernels: tests/export_check/engines.py fakes the
# GPU. Idempotent: a venv whose stamp matches this script is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${ENGINES_VENV:-.venv-engines}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION=0.34.0
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
# What `import vllm.entrypoints.cli.serve` + EngineArgs.create_engine_config and SGLang's
# prepare_server_args + resolve_once need, found by importing until nothing was missing.
# Pins where vLLM's and SGLang's own pins agree (transformers) or where vLLM pins (llguidance,
# xgrammar, which brings triton: SGLang imports it); SGLang's stricter pins (tokenizers==0.23.2, xgrammar==0.2.7) do not matter to
# its argument parsing.
ENGINE_REQUIREMENTS=(
    "transformers==5.19.0" "xgrammar==0.2.8" "apache-tvm-ffi==0.1.11" "llguidance==1.7.6"
    regex psutil pyzmq urllib3 requests fastapi pillow pybase64 cachetools openai
    openai-harmony cbor2 msgspec cloudpickle py-cpuinfo partial-json-parser uvicorn
    watchfiles orjson einops uvloop ipython dill sentencepiece gguf "compressed-tensors==0.17.0"
    pytest hypothesis  # the test run itself (tests/conftest.py imports hypothesis)
)
STAMP="$VENV/.engines-installed"
want="$(sha256sum "$0" pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    echo "engines venv $VENV is up to date"
    exit 0
fi

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# Keep torch on the CPU build whatever a requirement asks for.
constraints="$VENV/constraints.txt"
echo "torch==$TORCH_VERSION" >"$constraints"
# pip's notes about the engines' unmet (GPU) requirements are expected: keep them out.
quiet() { grep -vE "^WARNING: Location|requires .*(not installed|incompatible)|dependency resolver" || true; }
"${pip[@]}" "torch==$TORCH_VERSION" 2>&1 | quiet
"${pip[@]}" -c "$constraints" -e . 2>&1 | quiet
"${pip[@]}" --no-deps "vllm==$VLLM_VERSION" "sglang==$SGLANG_VERSION" 2>&1 | quiet
"${pip[@]}" -c "$constraints" "${ENGINE_REQUIREMENTS[@]}" 2>&1 | quiet
"$VENV/bin/python" -c "import vllm, sglang; print('vllm', vllm.__version__, 'sglang', sglang.__version__)"
echo "$want" >"$STAMP"
echo "engines venv $VENV installed in $(( $(date +%s) - start )) s"
