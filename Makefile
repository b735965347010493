PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The light install (what `pip install slotune` brings: no torch, no transformers) is all
# the simulator needs; `make tune` stops there, `make test` adds the engine and dev extras.
LIGHT_STAMP := $(VENV)/.installed-light

.PHONY: install test test-fast tune lint typecheck bench bench-baseline clean check-export

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,engine]'
	touch $(STAMP)

$(LIGHT_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e .
	touch $(LIGHT_STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

# Everything but the tests marked slow (separate processes, a browser, a database, long
# property runs): the loop while editing.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

tune: $(LIGHT_STAMP)
	$(BIN)/slotune tune --gpu h100 --slo ttft=300ms,tpot=50ms

# The project's regression suite against the committed baseline: timing rows report,
# simulated figures must match benchmarks/baseline.json (record a change with bench-baseline).
bench: $(STAMP)
	$(BIN)/slotune regress benchmarks/suite.yaml --baseline benchmarks/baseline.json --out slotune-out/bench

bench-baseline: $(STAMP)
	$(BIN)/slotune regress baseline benchmarks/suite.yaml --out benchmarks/baseline.json

# Every exported launch line through the real vLLM / SGLang parsers and config builders, in a
# separate venv (CPU torch, engine wheels with --no-deps; scripts/install_engines.sh).
ENGINES_VENV ?= .venv-engines
check-export:
	ENGINES_VENV=$(ENGINES_VENV) bash scripts/install_engines.sh
	$(ENGINES_VENV)/bin/python -m pytest tests/export_check -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# mypy over slotune/ ([tool.mypy] in pyproject.toml).
typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .venv-engines slotune-out .pytest_cache
