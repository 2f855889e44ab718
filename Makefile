# One set of commands for people, hooks and CI.
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DO_NOT_TRACK := true

.PHONY: setup demo test test-unit test-contract test-integration lint wheel bench services clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh

demo: setup
	$(BIN)/kenning demo

services:
	bash scripts/services.sh

PYTEST := $(BIN)/pytest -q --durations=15

test: setup services
	$(PYTEST)

test-unit: setup
	$(PYTEST) tests/unit

test-contract: setup services
	$(PYTEST) tests/contract

test-integration: setup services
	$(PYTEST) tests/integration

wheel: setup
	$(BIN)/python -m build --wheel --outdir dist .

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: setup
	$(BIN)/python -m bench.ingest --documents $${DOCUMENTS:-200}

clean:
	rm -rf .kenning bench/results dist build .pytest_cache .mypy_cache .ruff_cache .import_linter_cache

.PHONY: bench-locomo
bench-locomo: setup
	$(BIN)/python -m bench.locomo --conversations $${CONVERSATIONS:-5}
