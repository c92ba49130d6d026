"""Where each decoding press parts from kvpress's ``generate``, on the whole model (issue 60).

The slow test ``tests/test_lm_decoding_long.py`` compares every decoding press kvdrift replays
with kvpress's own ``generate`` inside the same press over 512 greedy positions on SmolLM2's
first 4 layers. This script runs the same comparison (the test's :func:`compare`: every
compression's scores and kept entries checked as well as the tokens) on the embedded SmolLM2
with ``--layers`` layers (default: all 30) over ``--steps`` positions (default 1,024, twice the
test's) and prints, per press, where the greedy tokens first part (``equal`` if never), the
gap between ``generate``'s two best logits there, the first compression whose kept entries
parted at a near tie (its forward, score gap and layer), and a verdict: ``equal``, ``near tie`` (the
parting is float noise at a near tie, as the test allows) or ``NOT A TIE`` (a bug). A
compression scored apart, or kept sets parted by more than noise, is printed as
``NOT A TIE`` with the test's message. Then partings per 1,000 positions observed (a row
that parted is observed up to its first parting).

Run: ``nice python benchmarks/decoding_exactness.py`` (about 3 CPU-minutes per press on the
whole model over 1,024 positions); ``--press DMSPress --press PrefillDecodingPress`` for some;
``--layers 4 --steps 512`` is the test itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    import pytest
    import torch

    from kvdrift.lm.loading.model import encode_prompt, load_model
    from tests.test_lm_decoding_long import (
        LOGIT_MARGIN,
        SPECS,
        TEXT,
        compare,
        first_layers,
    )

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--press", action="append", choices=sorted(SPECS),
                        help="a press of the test's SPECS (repeat; default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model("smollm2")
    ids = encode_prompt(loaded.tokenizer, TEXT * 3 + "Write a long commentary on this licence.")
    names = args.press or sorted(SPECS)
    print(f"SmolLM2, first {args.layers} layers, {ids.shape[1]}-token prompt, greedy, "
          f"{args.steps} positions")
    print(f"{'press':32s} {'equal to':>9s} {'logit gap':>10s} {'tie at':>7s} "
          f"{'tie gap':>9s} {'layer':>5s} {'scored':>7s} {'cpu s':>6s}  verdict")
    observed, parted = 0, 0
    with first_layers(loaded.model, args.layers) as model:
        for name in names:
            start = time.process_time()
            with pytest.MonkeyPatch.context() as monkeypatch:
                try:
                    c = compare(model, ids, name, monkeypatch, args.steps)
                except AssertionError as e:
                    print(f"{name:32s} NOT A TIE: {str(e).splitlines()[0]}", flush=True)
                    continue
            seconds = time.process_time() - start
            equal = args.steps if c.t is None else c.t
            observed += equal
            parted += c.t is not None
            verdict = "equal" if c.t is None else "near tie" if (
                c.t >= c.parted_at or c.logit_gap <= LOGIT_MARGIN) else "NOT A TIE"
            gap = "" if c.logit_gap is None else f"{c.logit_gap:.3g}"
            tie_at = "" if c.tie is None else str(c.parted_at)
            tie = "" if c.tie is None else f"{c.tie:.3g}"
            layer = "" if c.tie_layer is None else str(c.tie_layer)
            print(f"{name:32s} {equal:>9d} {gap:>10s} {tie_at:>7s} {tie:>9s} {layer:>5s} "
                  f"{c.compressions:>7d} {seconds:>6.0f}  {verdict}", flush=True)
    print(f"partings: {parted} in {observed} positions observed "
          f"({1000 * parted / max(observed, 1):.2f} per 1,000)")


if __name__ == "__main__":
    main()
