"""Peak resident memory of a whole measurement against the horizon (issue 60, item 1).

``benchmarks/long_horizon.py`` steps bare path states; this script measures what a user's run
holds: for each ``H`` a fresh process loads the embedded SmolLM2-135M (float32, CPU), optionally
cut to its first ``--layers`` decoder layers (a run at H = 4,096 over all 30 layers takes over
an hour on two shared cores; the cut model keeps every per-position cost of the run, the
records, tables and analysis, and shrinks only the per-entry cache bytes), and calls
``kvdrift.measure`` on one ~300-token document with ``--action`` (default
``decoding-knorm:interval=128,target=256``), K = ``--replicates`` rollouts at temperature 0.7,
nothing written to disk. The child reports its peak resident memory (``ru_maxrss``, what
``/usr/bin/time -f %M`` prints for ``kvdrift run``) and its resident memory before the run.

What a run must hold whatever the press: P's reference rows keep every generated entry,
``K x (H - 1)`` entries (``--batch B``: B replicates at a time, so ``B x (H - 1)``) of
``layers x kv_heads x head_dim x 2 x 4`` bytes. The table prints that formula beside each peak
and the peak without it, then the ratios to the smallest H of the peak and of the peak less
P's rows (the part a decoding press can bound).

Run: ``python benchmarks/run_memory.py --layers 4`` (about 15 minutes on two cores);
``--horizons 256 1024`` and ``--layers 30`` for the whole model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

MIB = 2**20
TEXT = ("The committee met on a grey morning to settle the budget for the coming year. Each "
        "member brought a list of needs, and the chair read them aloud one after another: new "
        "roofs for two schools, a bridge whose railings had rusted through, longer hours at "
        "the library, and a fund for the river's cleaning after the spring floods. ")


def _rss() -> int:
    text = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in text.splitlines()
                if line.startswith("VmRSS:"))


def child(args: argparse.Namespace) -> dict:
    """One measurement in this process (run by :func:`main` in a fresh one)."""
    import torch

    import kvdrift
    from kvdrift.lm.loading.model import load_model

    torch.set_num_threads(args.threads)
    lm = load_model("smollm2")
    model = lm.model
    if args.layers < model.config.num_hidden_layers:
        model.model.layers = torch.nn.ModuleList(list(model.model.layers)[:args.layers])
        model.config.num_hidden_layers = args.layers
    config = model.config
    entry = (args.layers * config.num_key_value_heads
             * (config.hidden_size // config.num_attention_heads) * 2 * 4)
    before = _rss()
    started = time.perf_counter()
    result = kvdrift.measure(kvdrift.Model(model, lm.tokenizer, "smollm2"), [args.action],
                             [{"id": "memo", "prompt": TEXT * 4 + "Write the minutes."}],
                             replicates=args.replicates, horizon=args.horizon,
                             temperature=0.7, seed=0, bootstrap=200, batch=args.batch)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    held = args.batch or args.replicates  # replicates whose P rows are held at once
    p_rows = min(held, args.replicates) * (args.horizon - 1) * entry
    return {"horizon": args.horizon, "peak": peak, "before": before, "p_rows": p_rows,
            "seconds": seconds, "tau": [int(t) for t in result.records.replicates["tau"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30, help="decoder layers kept (1-30)")
    parser.add_argument("--horizons", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--replicates", type=int, default=4, help="K")
    parser.add_argument("--action", default="decoding-knorm:interval=128,target=256")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the child")
    parser.add_argument("--batch", type=int, default=0,
                        help="most replicates per forward batch (0: all K at once)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--horizon", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.layers <= 30:
        parser.error(f"--layers {args.layers}: SmolLM2-135M has 30 decoder layers (1-30)")
    if args.child:
        print(json.dumps(child(args)))
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    print(f"SmolLM2-135M float32 cut to {args.layers} layer(s), CPU ({args.threads} threads), "
          f"K = {args.replicates} (batch {args.batch or args.replicates}), {args.action}, "
          f"temperature 0.7, one ~300-token document",
          flush=True)
    print("| H | peak MiB | P's rows MiB | peak less P's rows MiB | before the run MiB | "
          "run s | tau per replicate |")
    print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    rows = []
    for h in sorted(args.horizons):
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--horizon", str(h), "--layers",
             str(args.layers), "--replicates", str(args.replicates), "--action", args.action,
             "--threads", str(args.threads), "--batch", str(args.batch)],
            env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"H = {h}: the measurement failed (exit {out.returncode}):\n"
                             f"{out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(f"| {h:,} | {r['peak'] / MIB:,.0f} | {r['p_rows'] / MIB:,.1f} | "
              f"{(r['peak'] - r['p_rows']) / MIB:,.0f} | {r['before'] / MIB:,.0f} | "
              f"{r['seconds']:,.0f} | {r['tau']} |", flush=True)
    first = rows[0]
    print(f"\nratios to H = {first['horizon']:,}:")
    for r in rows[1:]:
        grown = r["peak"] - r["p_rows"] - first["peak"] + first["p_rows"]
        per = grown / max(1, r["horizon"] - first["horizon"]) / 1024
        print(f"  H = {r['horizon']:,}: peak {r['peak'] / first['peak']:.2f}x, peak less P's "
              f"rows {(r['peak'] - r['p_rows']) / (first['peak'] - first['p_rows']):.2f}x, "
              f"growth less P's rows {grown / MIB:,.0f} MiB ({per:.1f} KiB a position)")

if __name__ == "__main__":
    main()
