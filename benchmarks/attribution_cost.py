"""What ``--attribution`` costs: the demo study's run time with and without it, in one run.

The demo (``src/kvdrift/configs/cpu-demo.toml``: SmolLM2, snapkv-half and recent-half, K = 4,
H = 32, 512-token RULER tasks) is run at its smallest meaningful size, one document per task
family instead of two (``--per-stratum`` to change), twice in this process on one loaded
model: without attribution, then with it, each into a fresh directory. Prints both wall
times, the time spent in the attribution itself (summed around its one call per unit), the
divergent replicates it replayed, and the cost as a ratio to the run without it.

Run: ``python benchmarks/attribution_cost.py`` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tomllib
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the kvdrift command sets it

import pyarrow.parquet as pq  # noqa: E402

from kvdrift.api import shipped_config  # noqa: E402
from kvdrift.lm.loading.model import load_model  # noqa: E402
from kvdrift.run import lost_context  # noqa: E402
from kvdrift.study import run_study  # noqa: E402
from kvdrift.study_config import parse_study  # noqa: E402


def demo_study(per_stratum: int, attribution: bool):
    """The demo's study with ``per_stratum`` documents per task family."""
    data = tomllib.loads(shipped_config("cpu-demo").read_text(encoding="utf-8"))
    data["study"]["attribution"] = attribution
    for table in data["documents"]:
        table["per_stratum"] = per_stratum
    return parse_study(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-stratum", type=int, default=1,
                        help="documents per task family (the demo has 2)")
    args = parser.parse_args()
    plain = demo_study(args.per_stratum, False)
    loaded = load_model("smollm2", plain.device, plain.dtype)
    spent = {"seconds": 0.0, "units": 0}
    timed = lost_context.with_lost_context

    def counting(*a, **kw):
        started = time.perf_counter()
        try:
            return timed(*a, **kw)
        finally:
            spent["seconds"] += time.perf_counter() - started
            spent["units"] += 1

    lost_context.with_lost_context = counting
    walls = {}
    with tempfile.TemporaryDirectory() as tmp:
        for attribution in (False, True):
            config = demo_study(args.per_stratum, attribution)
            out = Path(tmp) / f"attribution-{attribution}"
            started = time.perf_counter()
            run_study(config, out, load=lambda name: loaded)
            walls[attribution] = time.perf_counter() - started
        reps = pq.read_table(Path(tmp) / "attribution-True" / "replicates").to_pandas()
    replayed = int((reps["tau"] > 0).sum())
    base, extra = walls[False], walls[True] - walls[False]
    print(f"demo at {args.per_stratum} document(s) per task family: "
          f"{len(reps)} replicates, {replayed} diverged (replayed)")
    print(f"run without attribution: {base:.1f} s; with: {walls[True]:.1f} s")
    print(f"attribution itself: {spent['seconds']:.2f} s over {spent['units']} units "
          f"({spent['seconds'] / max(replayed, 1) * 1000:.0f} ms per divergent replicate)")
    print(f"cost ratio (attribution time / run without it): {spent['seconds'] / base:.3f}; "
          f"wall-time difference / run without it: {extra / base:+.3f}")


if __name__ == "__main__":
    main()
