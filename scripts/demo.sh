#!/usr/bin/env bash
# Set up .venv if needed, then run the main job: a small study on the embedded SmolLM2 model
# and generated RULER-style documents (a few minutes on 2 CPU cores), ending with its report.
# Interrupt it any time: running it again resumes where it stopped.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/kvdrift study src/kvdrift/configs/cpu-demo.toml --out kvdrift-out/cpu-demo "$@"
