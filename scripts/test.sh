#!/usr/bin/env bash
# Set up .venv if needed, then lint and run the whole test suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/ruff check src tests benchmarks
.venv/bin/python -m pytest -q "$@"
