"""How much the protocol changes the numbers: the whole prompt compressed, or the context only.

Generates RULER-style documents (the same text twice: once compressed whole, once split at
its question, ``question_after``), measures each action under both protocols with the same
seed, and prints per action and protocol the risk R, P(tau <= H), the mean divergence time
among divergent replicates and P(tau = 1) (a first position that differs: only possible when
the question is read over the compressed context), then the difference in R.

Run: ``python benchmarks/question_protocol.py`` (the embedded SmolLM2; a few minutes on two
cores) or ``--model <path>``; ``--docs``, ``--replicates``, ``--horizon`` shrink or grow it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import kvdrift  # noqa: E402
from kvdrift.data.loaders import write_jsonl  # noqa: E402
from kvdrift.data.ruler import RulerConfig, generate  # noqa: E402
from kvdrift.lm.loading.model import load_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--actions", default="snapkv-half,recent-half")
    parser.add_argument("--families", default="niah_single,vt")
    parser.add_argument("--docs", type=int, default=3, help="documents per family")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--replicates", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=32)
    args = parser.parse_args()
    loaded = load_model(args.model)
    model = kvdrift.Model(loaded.model, loaded.tokenizer, args.model)
    actions = tuple(args.actions.split(","))
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for split in (False, True):
            config = RulerConfig(families=tuple(args.families.split(",")),
                                 target_lengths=(args.length,),
                                 documents_per_stratum=args.docs, question_after=split)
            path = write_jsonl(generate(config, loaded.tokenizer), Path(tmp) / f"{split}.jsonl")
            result = kvdrift.measure(model, actions, path, bootstrap=0,
                                     replicates=args.replicates, horizon=args.horizon)
            reps = result.records.replicates
            for action in actions:
                r = reps[reps.action == action]
                diverged = r[r.tau > 0]
                rows[(action, split)] = (float(r.risk.mean()), float((r.tau > 0).mean()),
                                         float(diverged.tau.mean()) if len(diverged) else 0.0,
                                         float((r.tau == 1).mean()))
    print(f"model {args.model}, {args.docs} documents per family ({args.families}), "
          f"{args.length} tokens, K = {args.replicates}, H = {args.horizon}")
    print(f"{'action':<16}{'protocol':<26}{'R':>8}{'P(tau<=H)':>11}{'mean tau':>10}"
          f"{'P(tau=1)':>10}")
    for action in actions:
        for split in (False, True):
            risk, diverged, tau, first = rows[(action, split)]
            name = "context, then question" if split else "whole prompt"
            print(f"{action:<16}{name:<26}{risk:>8.4f}{diverged:>11.3f}{tau:>10.2f}"
                  f"{first:>10.3f}")
        print(f"{'':<16}{'R(context) - R(whole)':<26}"
              f"{rows[(action, True)][0] - rows[(action, False)][0]:>+8.4f}")


if __name__ == "__main__":
    main()
