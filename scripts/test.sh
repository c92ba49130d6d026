#!/usr/bin/env bash
# Set up .venv if needed, lint, build the documentation site (strict), then run the tests.
#   bash scripts/test.sh          the fast lane: every test not marked slow (minutes)
#   bash scripts/test.sh --slow   the slow lane: only the tests marked slow (embedded SmolLM2)
#   bash scripts/test.sh --all    every test, both lanes (what .ci/run runs)
# Other arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
lane=(-m "not slow")
args=()
for arg in "$@"; do
  case "$arg" in
    --slow) lane=(-m slow) ;;
    --all) lane=() ;;
    *) args+=("$arg") ;;
  esac
done
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/ruff check src tests benchmarks
# A broken link, a missing page or a docstring reference that does not resolve fails here.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
# One worker per core (KVDRIFT_TEST_WORKERS overrides; 0 runs in this process); a module's
# tests stay on one worker (tests/conftest.py).
workers="${KVDRIFT_TEST_WORKERS:-$(nproc)}"
.venv/bin/python -m pytest -q -n "$workers" --dist loadgroup ${lane[@]+"${lane[@]}"} \
  ${args[@]+"${args[@]}"}
