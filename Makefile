# One set of commands for people, hooks and CI.
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DO_NOT_TRACK := true

.PHONY: setup demo test lint bench services clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh

demo: setup
	$(BIN)/kenning demo

services:
	bash scripts/services.sh

test: setup services
	$(BIN)/pytest -q

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: setup
	$(BIN)/python -m bench.ingest --documents $${DOCUMENTS:-200}

clean:
	rm -rf .kenning bench/results .pytest_cache .mypy_cache .ruff_cache
