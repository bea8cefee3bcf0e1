# fleetgate: the two set-up commands are `make up` and `make test`; both create/refresh .venv themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: up test lint bench venv clean test-fast

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

up: $(STAMP)
	$(BIN)/fleetgate up

test: $(STAMP)
	bash scripts/test.sh $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -x tests/unit tests/property

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

bench: $(STAMP)
	bash bench/run_all.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Real engines on the tiny model built from code (caches under ~/.cache/fleetgate; see docs/real-engines.md).
.PHONY: tiny-model llama-server real-engines vllm-cpu test-vllm
tiny-model:
	bash scripts/build_tiny_model.sh

llama-server:
	bash scripts/build_llama_server.sh

real-engines: tiny-model llama-server

vllm-cpu:
	bash scripts/build_vllm_cpu.sh

test-vllm: $(STAMP) tiny-model vllm-cpu
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/integration/test_vllm_engine.py

# Long reliability runs, not in CI (docs/reliability.md): 10,000-request chaos run, >= 10,000-case API fuzzing,
# 30-minute soak at 80% load (SOAK_S=300 for a 5-minute one).
SOAK_S ?= 1800
.PHONY: soak
soak: $(STAMP)
	bash -c 'FLEETGATE_CHAOS_REQUESTS=10000 FLEETGATE_CHAOS_RATE=40 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/chaos && \
	  FLEETGATE_FUZZ_EXAMPLES=4500 FLEETGATE_PARSER_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/fuzz && \
	  $(BIN)/python bench/soak.py --duration-s $(SOAK_S)'
