#!/usr/bin/env bash
# Create .venv and install kenning with its local-embedding and development extras.
# torch is pinned first so pip takes the CPU build instead of a CUDA one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[local,dev]"
# Debian's chromium, for the graph view's browser test (skipped without it); root only.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
    || echo "install: chromium could not be installed; the graph view's browser test will be skipped"
fi
touch .venv/.installed
echo "install: kenning is installed in .venv"
