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

# The real-model tier (not in `make test` or CI): builds llama-cpp-python's server and the model
# on first use (about 10 minutes), starts it on 127.0.0.1 unless KENNING_REAL_LLM_URL names one,
# and stops it afterwards unless it was already running. See scripts/real_llm.sh.
.PHONY: test-llm
test-llm: setup
	@if [ -n "$$KENNING_REAL_LLM_URL" ]; then exec $(PYTEST) -o timeout=3600 -m real_llm tests/real_llm; fi; \
	was_up=$$(bash scripts/real_llm.sh url 2>/dev/null || true); \
	bash scripts/real_llm.sh start || exit 1; \
	KENNING_REAL_LLM_URL=$$(bash scripts/real_llm.sh url)/v1 $(PYTEST) -o timeout=3600 -m real_llm tests/real_llm; rc=$$?; \
	[ -n "$$was_up" ] || bash scripts/real_llm.sh stop; exit $$rc
