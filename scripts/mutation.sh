#!/usr/bin/env bash
# Mutation testing of kvdrift's core modules with mutmut (not in CI: minutes to hours).
#
#   bash scripts/mutation.sh                  # every core module, one after another
#   bash scripts/mutation.sh coupling records # only these modules (names from the table below)
#   bash scripts/mutation.sh analysis.plan    # one file of analysis/
#   bash scripts/mutation.sh finite.check     # one named file of a package (see the table)
#
# For each module the script copies the working tree (tracked and untracked, not ignored
# files) to $MUTATION_DIR/<module> (default /tmp/kvdrift-mutation), mutates that one module
# and runs only the fast test files that exercise it, at the lowest CPU priority. It prints
# mutmut's counts per module (killed = a test failed on the mutant: good; survived = no test
# noticed the change) and leaves the work directory for `mutmut show NAME` / `mutmut results`.
# Environment: PYTHON (default .venv/bin/python), MAX_CHILDREN (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
MUTMUT="$(dirname "$PYTHON")/mutmut"
WORK=${MUTATION_DIR:-/tmp/kvdrift-mutation}
MAX_CHILDREN=${MAX_CHILDREN:-2}

# module -> "source files|fast test files" (the tests that exercise it without loading a model)
declare -A MODULES=(
  [coupling]="src/kvdrift/coupling.py|tests/test_coupling.py tests/test_coupling_exact.py"
  [estimate]="src/kvdrift/estimate/*|tests/test_estimate.py tests/test_estimate_exact.py tests/test_readings.py"
  [finite]="src/kvdrift/finite/pair.py src/kvdrift/finite/systems.py src/kvdrift/finite/exact.py|tests/test_finite.py tests/test_finite_inputs.py tests/test_finite_variance.py"
  [finite.check]="src/kvdrift/finite/check.py|tests/test_finite_study.py tests/test_cli.py"
  [records]="src/kvdrift/run/records.py|tests/test_run_exact.py"
  [runner]="src/kvdrift/run/runner.py|tests/test_run_exact.py tests/test_runner.py"
  [store]="src/kvdrift/run/store.py|tests/test_run_exact.py tests/test_runner.py"
  [analysis]="src/kvdrift/analysis/*|tests/test_analysis_helpers.py tests/test_analysis.py tests/test_analysis_exact.py tests/test_predict.py tests/test_plan.py tests/test_study_analysis.py tests/test_study_breakdowns.py tests/test_results.py tests/test_divergence.py tests/test_checks.py tests/test_task_outcomes.py tests/test_readings.py"
  [divergence]="src/kvdrift/divergence.py|tests/test_divergence.py tests/test_analysis_helpers.py tests/test_estimate_exact.py"
  [checks]="src/kvdrift/checks.py|tests/test_checks.py tests/test_analysis_helpers.py tests/test_finite_inputs.py"
  [cache]="src/kvdrift/lm/engine/cache.py|tests/test_lm_cache.py tests/test_lm_pair.py tests/test_shared_attention.py"
  [attention]="src/kvdrift/lm/engine/shared_attention.py|tests/test_shared_attention.py tests/test_joint_step.py tests/test_lm_presses.py tests/test_lm_quantize.py"
  [pair]="src/kvdrift/lm/engine/pair.py src/kvdrift/lm/engine/prefill.py|tests/test_lm_pair.py tests/test_lm_pair_inputs.py tests/test_lm_presses.py tests/test_shared_attention.py tests/test_lm_actions.py tests/test_lm_estimators.py"
)
# analysis.<file>: one file of analysis/ at a time, against the same tests (a shorter run)
for f in src/kvdrift/analysis/*.py; do
  stem=$(basename "$f" .py)
  [ "$stem" = "__init__" ] || MODULES[analysis.$stem]="$f|${MODULES[analysis]#*|}"
done
ORDER=(coupling estimate finite finite.check records runner store divergence checks analysis cache attention pair)
[ $# -gt 0 ] && ORDER=("$@")

for name in "${ORDER[@]}"; do
  entry=${MODULES[$name]:-}
  if [ -z "$entry" ]; then
    echo "unknown module '$name'; allowed: ${!MODULES[*]}" >&2
    exit 2
  fi
  src=${entry%%|*}
  tests=()
  for t in ${entry#*|}; do [ -f "$t" ] && tests+=("\"$t\""); done
  dir=$WORK/${name//./-}
  rm -rf "$dir"
  mkdir -p "$dir"
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$dir"
  cat >> "$dir/pyproject.toml" <<TOML

[tool.mutmut]
source_paths = ["src/kvdrift"]
only_mutate = [$(set -f; printf '"%s",' $src)]
pytest_add_cli_args_test_selection = [$(IFS=,; echo "${tests[*]}")]
pytest_add_cli_args = ["-m", "not slow", "-q", "-p", "no:cacheprovider"]
process_isolation = "forkserver"
use_git_change_detection = false
also_copy = ["README.md", "docs"]
TOML
  echo "== $name: $src against ${tests[*]}"
  (cd "$dir" && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 nice -n 19 "$MUTMUT" run \
      --max-children "$MAX_CHILDREN" > mutmut.log 2>&1) || echo "mutmut exited $? (see $dir/mutmut.log)"
  (cd "$dir" && "$MUTMUT" export-cicd-stats > /dev/null 2>&1 || true
   "$PYTHON" - "$name" <<'PY'
import json, sys
s = json.load(open("mutants/mutmut-cicd-stats.json"))
total = s.get("total", 0)
print(f"{sys.argv[1]}: killed {s.get('killed', 0)} / {total}, survived {s.get('survived', 0)}, "
      f"timeout {s.get('timeout', 0)}, no tests {s.get('no_tests', 0)}, "
      f"suspicious {s.get('suspicious', 0)}, skipped {s.get('skipped', 0)}")
PY
   "$MUTMUT" results 2>/dev/null | sed 's/^/  /' || true)
done
