#!/usr/bin/env bash
# Set up .venv if needed, then run the main job on the embedded default.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p kvdrift-out
.venv/bin/kvdrift finite-state --figure kvdrift-out/finite-state.png "$@"
