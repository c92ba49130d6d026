"""Time one coupled rollout step against one step of plain sampling with ``generate``.

(a) coupled step = one position of kvdrift's rollout estimator: three K-row paths (P along X,
    Q along Y, Q forced along X), the coupled draw, TVs and records;
(b) ``model.generate(do_sample=True, num_return_sequences=K)`` per generated position: the
    gaps between consecutive calls of a stopping criterion, so prefill is excluded.
Coupled runs are taken before and after the generate run so that drift in machine speed
shows up (shared CPUs are noisy); their mean is compared with generate's median step.

Run: ``python benchmarks/bench_coupled_step.py [--K 16] [--H 32] [--prompt-tokens 1000]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the kvdrift command sets it

import torch  # noqa: E402
from transformers import StoppingCriteria, StoppingCriteriaList  # noqa: E402

from kvdrift.estimate import coupled_rollouts  # noqa: E402
from kvdrift.lm.model import encode_prompt, load_model  # noqa: E402
from kvdrift.lm.pair import LMKernelPair  # noqa: E402

PARAGRAPH = (
    "The river town grew around a ferry crossing. Merchants built warehouses along the bank, "
    "farmers brought grain on market days, and the ferryman kept a ledger of every crossing. "
    "When the bridge was finally built, the ferry stopped, but the ledger survived in the town "
    "archive, where historians still read it to learn who travelled, when, and why. "
)


def build_prompt(tokenizer, n_tokens: int) -> torch.Tensor:
    """A chat prompt of about ``n_tokens`` tokens made of repeated text and a question."""
    question = "Summarise the text above in three sentences."
    reps = 1
    while True:
        ids = encode_prompt(tokenizer, PARAGRAPH * reps + question)
        if ids.shape[1] >= n_tokens:
            return ids
        reps += 1


def time_coupled(pair: LMKernelPair, k: int, h: int, seed: int) -> tuple[float, float]:
    """Seconds per position of kvdrift's rollout estimator, and the mean fixed-history TV.

    This is the real estimator (:func:`kvdrift.estimate.coupled_rollouts`): three K-row paths
    (P along X, Q along Y, Q along X), EOS handling, the coupled draw and the records.
    """
    start = time.perf_counter()
    result = coupled_rollouts(pair, k, h, seed=seed)
    return (time.perf_counter() - start) / h, float(result.f.mean())


class StepClock(StoppingCriteria):
    """Records a timestamp each time ``generate`` finishes a position (never stops it)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def time_generate(model, ids: torch.Tensor, k: int, h: int, seed: int) -> tuple[list[float], float]:
    """Seconds of each decoding step of ``generate`` (H - 1 of them) and of prefill + first token.

    Steps are the gaps between consecutive stopping-criteria calls, so the prefill (done on
    ``k`` expanded copies of the prompt) is excluded without a second run.
    """
    torch.manual_seed(seed)
    clock = StepClock()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                       top_k=0, top_p=1.0, num_return_sequences=k, max_new_tokens=h,
                       min_new_tokens=h, stopping_criteria=StoppingCriteriaList([clock]))
    gaps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:], strict=False)]
    return gaps, clock.stamps[0] - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--action", default="snapkv-half")
    parser.add_argument("--K", type=int, default=16, help="replicates")
    parser.add_argument("--H", type=int, default=32, help="generated positions")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    lm = load_model(args.model, attn_implementation=args.attn)
    print(f"model load: {time.perf_counter() - t0:.1f} s  (threads={torch.get_num_threads()}, "
          f"attn={args.attn})")
    ids = build_prompt(lm.tokenizer, args.prompt_tokens)
    t0 = time.perf_counter()
    pair = LMKernelPair(lm, ids, args.action)
    setup = time.perf_counter() - t0
    print(f"prompt: {ids.shape[1]} tokens; action {args.action} keeps "
          f"{pair.prompt_cache('q').kept}; pair setup (two prefills): {setup:.2f} s")

    time_coupled(pair, args.K, 2, args.seed)  # warm-up
    before, mean_f = time_coupled(pair, args.K, args.H, args.seed)
    gaps, first = time_generate(lm.model, ids, args.K, args.H, args.seed)
    after, _ = time_coupled(pair, args.K, args.H, args.seed)
    coupled = (before + after) / 2
    per_position = statistics.median(gaps)

    def ms(xs: list[float]) -> str:
        return f"{1000 * statistics.median(xs):.1f}"

    print(f"coupled step (rollout estimator, 3 paths x {args.K} rows): {1000 * coupled:.1f} ms "
          f"/ position (before {1000 * before:.1f}, after {1000 * after:.1f}; "
          f"mean f_t {mean_f:.3f})")
    print(f"generate, {args.K} sampled sequences: {1000 * per_position:.1f} ms / position "
          f"(median of {len(gaps)} steps; prefill of {args.K} copies + first token {first:.1f} s)")
    print(f"ratio coupled / generate: {coupled / per_position:.2f}  (goal <= 3)")


if __name__ == "__main__":
    main()
