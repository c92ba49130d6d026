"""What checking the model around a press costs (:mod:`kvdrift.lm.model_state`), as ratios.

A unit whose action is a press object takes the model's state twice (before the unit, and
around the press's prefill) and compares it once each after. Prints the seconds of one state
taken, compared and put back (median of ``--repeats``), against one prefill of a
``--tokens``-token prompt inside a KnormPress (the general path's own work per unit) and against
the weights digest each such unit already computes.

Run: ``python benchmarks/model_state_cost.py`` (SmolLM2-135M's architecture, random weights:
nothing is downloaded or read but its config; seconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the kvdrift command sets it

import kvpress  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from kvdrift.lm.engine.press_path import press_prompt_cache  # noqa: E402
from kvdrift.lm.loading.digest import weights_digest  # noqa: E402
from kvdrift.lm.loading.model import text_config  # noqa: E402
from kvdrift.lm.model_state import ModelState  # noqa: E402


def median_seconds(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check_once(model) -> None:
    state = ModelState.of(model)
    assert state.changes() == ()
    state.restore()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(text_config("smollm2"),
                                             attn_implementation="sdpa").eval()
    ids = torch.randint(3, model.config.vocab_size, (1, args.tokens))
    press = kvpress.KnormPress(compression_ratio=0.5)
    state = median_seconds(lambda: check_once(model), args.repeats * 4)
    prefill = median_seconds(lambda: press_prompt_cache(model, ids, press, "k", "d"),
                             args.repeats)
    digest = median_seconds(lambda: weights_digest(model), args.repeats)
    modules = sum(1 for _ in model.modules())
    print(f"SmolLM2-135M architecture ({modules} modules), {args.tokens}-token prompt, CPU")
    print(f"state taken, compared, put back: {state * 1e3:.1f} ms")
    print(f"press prefill (KnormPress, includes one state): {prefill * 1e3:.1f} ms "
          f"-> state / prefill = {state / prefill:.3f}")
    print(f"weights digest: {digest * 1e3:.1f} ms -> state / digest = {state / digest:.3f}")


if __name__ == "__main__":
    main()
