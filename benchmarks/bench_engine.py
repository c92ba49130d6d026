"""The LM engine's speed and memory, as ratios measured in one run on the embedded SmolLM2.

Prints:
1. coupled step / one forward at (K = 16, n = 1,000) and (K = 16, n = 4,000), the median of
   five repeats that each time the three back to back (the machine's speed drifts), and the
   time the coupled step spends in the attention over the prompt. The coupled step is one
   position of the real rollout estimator (:func:`kvdrift.estimate.coupled_rollouts`,
   action snapkv-half), whose three paths advance in one joint step; "one forward" is one
   decoding step of 3K rows against a 16-token prompt (weights and MLP, no long attention)
   through the same kernel pair, and the three-forward floor is three K-row steps (what the
   coupled step cost before the joint step). Also the largest float difference of the joint
   step from separate steps at n = 1,000 (logits and log-probabilities, three paths).
   At n = 1,000 also the non-view operators and host synchronisations per coupled position
   against one plain forward of the same 3K rows (counts, ``dispatch_count.py``).
2. coupled step / ``generate(num_return_sequences=K)`` per position at n = 1,000 (generate's
   prompt cache is prefilled once and repeated K times, so only its decoding steps are timed).
3. SWRB wall time / rollout wall time at the same K and H on one document (median of five),
   the rows and model calls each runs, the per-replicate variances of both estimators of R, and
   SWRB's variance-per-time advantage over rollouts.
4. the peak resident memory of ``kvdrift run --replicates 64 --horizon 16`` on one
   4,096-token document with snapkv-half (a separate process, so only that run counts).
5. the setup of a three-action document (snapkv-half, recent-half, snapkv-512: the pair
   factory builds all three pairs, P's cache and each Q's, from one prefill forward) against
   one full-cache prefill of the same ~2,000-token document, and the same for the former path
   (P's prefill plus one prefill per action inside its press), twice each.

Run: ``python benchmarks/bench_engine.py`` (about 10 minutes on 2 CPU cores);
``--quick`` uses smaller sizes to try the script, ``--setup`` runs only item 5.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the kvdrift command sets it

import torch  # noqa: E402
from dispatch_count import RowCounter, coupled_and_plain  # noqa: E402
from transformers import DynamicCache, StoppingCriteria, StoppingCriteriaList  # noqa: E402

from kvdrift.data.document import Document  # noqa: E402
from kvdrift.estimate import coupled_rollouts, swrb  # noqa: E402
from kvdrift.lm.engine import shared_attention  # noqa: E402
from kvdrift.lm.engine.pair import LMKernelPair  # noqa: E402
from kvdrift.lm.engine.prefill import prefill  # noqa: E402
from kvdrift.lm.factory import LMPairFactory  # noqa: E402
from kvdrift.lm.loading.model import LoadedModel, encode_prompt, load_model  # noqa: E402

SETUP_ACTIONS = ("snapkv-half", "recent-half", "snapkv-512")

PARAGRAPH = (
    "The river town grew around a ferry crossing. Merchants built warehouses along the bank, "
    "farmers brought grain on market days, and the ferryman kept a ledger of every crossing. "
    "When the bridge was finally built, the ferry stopped, but the ledger survived in the town "
    "archive, where historians still read it to learn who travelled, when, and why. "
)
QUESTION = "Summarise the text above in three sentences."


def prompt_text(tokenizer, n_tokens: int) -> str:
    """Text whose chat prompt has at most ``n_tokens`` tokens (and nearly that many)."""
    words = (PARAGRAPH * (n_tokens // 40 + 2)).split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # the longest prefix of words that fits
        mid = (lo + hi + 1) // 2
        if encode_prompt(tokenizer, " ".join(words[:mid]) + " " + QUESTION).shape[1] <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + " " + QUESTION


def seconds_per_position_floor(lm: LoadedModel, k: int, h: int, paths: int = 3) -> float:
    """``paths`` separate K-row decoding steps per position against a 16-token prompt
    (``paths = 1`` with ``3 K`` rows: one forward of the coupled step's rows)."""
    ids = torch.randint(3, 1000, (1, 16), generator=torch.Generator().manual_seed(0))
    pair = LMKernelPair(lm, ids, "full")
    states = [pair.start(side, k) for side in ("p", "q", "q")[:paths]]
    tokens = torch.randint(3, 1000, (h, k), generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    for t in range(h):
        states = [pair.advance(s, tokens[t]) for s in states]
    return (time.perf_counter() - start) / h


def seconds_per_position_one_forward(lm: LoadedModel, k: int, h: int) -> float:
    """One decoding step of 3K rows per position against a 16-token prompt."""
    return seconds_per_position_floor(lm, 3 * k, h, paths=1)


def fused_against_separate(pair: LMKernelPair, k: int, steps: int) -> tuple[float, float]:
    """Largest |difference| of logits and of log-probabilities, joint step against separate
    steps, over ``steps`` positions of P, Q and a forced Q path (K rows each, random tokens)."""
    tokens = torch.randint(3, 1000, (steps, k), generator=torch.Generator().manual_seed(2))
    joint = [pair.start(side, k) for side in ("p", "q", "q")]
    separate = [pair.start(side, k) for side in ("p", "q", "q")]
    logits = logprobs = 0.0
    for t in range(steps):
        toks = [tokens[t], tokens[t].flip(0), tokens[t]]
        joint = pair.advance_many(joint, toks)
        separate = [pair.advance(s, tok) for s, tok in zip(separate, toks, strict=True)]
        for a, b in zip(joint, separate, strict=True):
            logits = max(logits, float((a.logits - b.logits).abs().max()))
            logprobs = max(logprobs, float((pair.logprobs(a) - pair.logprobs(b)).abs().max()))
    return logits, logprobs


def operators_per_position(lm: LoadedModel, pair: LMKernelPair, k: int,
                           h: int) -> tuple[float, float, int, dict]:
    """Non-view operators and host syncs per position of the coupled rollouts
    (``dispatch_count.py``), and the operators of one plain forward of 3K rows without cache."""
    counts, plain = coupled_and_plain(lm.model, pair, k, h, torch.zeros(3 * k, 1, dtype=torch.long))
    return counts.ops / h, counts.syncs / h, plain.ops, dict(counts.sync_names)


def seconds_per_position_coupled(pair: LMKernelPair, k: int, h: int) -> float:
    start = time.perf_counter()
    coupled_rollouts(pair, k, h, seed=0)
    return (time.perf_counter() - start) / h


@contextlib.contextmanager
def prompt_attention_clock() -> Iterator[list[float]]:
    """Seconds spent in the shared-prompt attention's prompt part (all layers, both sides)
    while the block runs: the one cost a long prompt adds to a decoding step."""
    spent = [0.0]
    inner = shared_attention._prompt_attention

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    shared_attention._prompt_attention = timed
    try:
        yield spent
    finally:
        shared_attention._prompt_attention = inner


class StepClock(StoppingCriteria):
    """Records a timestamp each time ``generate`` finishes a position (never stops it)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def seconds_per_position_generate(lm: LoadedModel, ids: torch.Tensor, k: int, h: int) -> float:
    """Median decoding step of ``generate`` sampling K sequences (prefill done once, repeated)."""
    cache = DynamicCache(config=lm.model.config)
    with torch.no_grad():
        lm.model(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(k)
    clock = StepClock()
    torch.manual_seed(0)
    with torch.no_grad():
        lm.model.generate(ids.expand(k, -1), attention_mask=torch.ones_like(ids).expand(k, -1),
                          past_key_values=cache, do_sample=True, temperature=1.0, top_k=0,
                          top_p=1.0, max_new_tokens=h, min_new_tokens=h,
                          stopping_criteria=StoppingCriteriaList([clock]))
    return statistics.median(b - a for a, b in zip(clock.stamps, clock.stamps[1:], strict=False))


def swrb_against_rollouts(pair: LMKernelPair, k: int, h: int) -> dict:
    counter = pair.advance_many
    if not isinstance(counter, RowCounter):
        counter = RowCounter(pair)
    counter.calls = counter.rows = 0
    start = time.perf_counter()
    naive = coupled_rollouts(pair, k, h, seed=1)
    t_rollout = time.perf_counter() - start
    calls_rollout, rows_rollout = counter.calls, counter.rows
    counter.calls = counter.rows = 0
    start = time.perf_counter()
    branched = swrb(pair, k, h, seed=1)
    t_swrb = time.perf_counter() - start
    d = naive.mismatch.double().mean(dim=1)  # per-replicate D_H
    var_naive, var_swrb = float(d.var()), float(branched.z_R.var())
    return {"t_rollout": t_rollout, "t_swrb": t_swrb, "R_rollout": float(d.mean()),
            "R_swrb": float(branched.z_R.mean()), "var_rollout": var_naive, "var_swrb": var_swrb,
            "calls_rollout": calls_rollout, "rows_rollout": rows_rollout,
            "calls_swrb": counter.calls, "rows_swrb": counter.rows}


def peak_rss_of_run(text: str, k: int, h: int) -> float:
    """Peak resident memory (GiB) of a ``kvdrift run`` process on one document."""
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "doc.jsonl"
        docs.write_text(json.dumps({"id": "long", "prompt": text}) + "\n")
        code = ("import sys; from kvdrift.cli import main; sys.argv = ['kvdrift'] + sys.argv[1:]; "
                "main()")
        cmd = [sys.executable, "-c", code, "run", "--docs", str(docs), "--actions", "snapkv-half",
               "--replicates", str(k), "--horizon", str(h), "--out", str(Path(tmp) / "run"),
               "--json"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if after <= before:
        raise RuntimeError("could not measure the child's peak memory")
    return after / 2**20  # ru_maxrss is in KiB on Linux


def setup_against_one_prefill(lm: LoadedModel, text: str) -> dict:
    """Seconds for one full-cache prefill, for the factory's setup of a three-action document
    (one shared prefill) and for the former setup (P's prefill plus one per action)."""
    ids = encode_prompt(lm.tokenizer, text)

    def one() -> float:
        t = time.perf_counter()
        prefill(lm.model, ids)
        return time.perf_counter() - t

    def shared() -> float:
        t = time.perf_counter()
        factory = LMPairFactory(lm)
        doc = Document(id="bench", prompt=text)
        factory.prepare(doc, SETUP_ACTIONS)
        for action in SETUP_ACTIONS:
            factory(doc, action)
        return time.perf_counter() - t

    def separate() -> float:
        t = time.perf_counter()
        reference = prefill(lm.model, ids)
        for action in SETUP_ACTIONS:
            LMKernelPair(lm, ids, action, reference=reference)
        return time.perf_counter() - t

    one()  # warm-up
    runs = []
    for _ in range(2):
        first, s, old, last = one(), shared(), separate(), one()
        runs.append({"n": ids.shape[1], "prefill": (first + last) / 2, "shared": s,
                     "separate": old})
    return runs


def print_setup(lm: LoadedModel, n_tokens: int) -> None:
    for i, r in enumerate(setup_against_one_prefill(lm, prompt_text(lm.tokenizer, n_tokens))):
        print(f"setup of a three-action document ({', '.join(SETUP_ACTIONS)}), n = {r['n']}, "
              f"run {i + 1}: one prefill {r['prefill']:.2f} s; shared {r['shared']:.2f} s, "
              f"ratio {r['shared'] / r['prefill']:.2f}; former (a prefill per action) "
              f"{r['separate']:.2f} s, ratio {r['separate'] / r['prefill']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, to try the script")
    parser.add_argument("--setup", action="store_true", help="only the three-action setup")
    args = parser.parse_args()
    q = args.quick
    setup_n = 500 if q else 2000
    if args.setup:
        print_setup(load_model("smollm2"), setup_n)
        return
    k, h = (4, 4) if q else (16, 16)
    repeats = 5
    lengths = (200, 400) if q else (1000, 4000)
    swrb_k, swrb_h, swrb_n = (8, 8, 300) if q else (64, 16, 626)
    rss_k, rss_h, rss_n = (8, 4, 512) if q else (64, 16, 4096)

    lm = load_model("smollm2")
    print(f"SmolLM2-135M float32 on {torch.get_num_threads()} CPU threads; K = {k}, H = {h}")
    seconds_per_position_floor(lm, k, 2)  # warm-up
    seconds_per_position_one_forward(lm, k, 2)

    one, floor = seconds_per_position_one_forward(lm, k, h), seconds_per_position_floor(lm, k, h)
    print(f"one forward ({3 * k} rows on a 16-token prompt): {1000 * one:.0f} ms / position; "
          f"three-forward floor (three {k}-row steps): {1000 * floor:.0f} ms / position")
    for n in lengths:
        ids = encode_prompt(lm.tokenizer, prompt_text(lm.tokenizer, n))
        pair = LMKernelPair(lm, ids, "snapkv-half")
        seconds_per_position_coupled(pair, k, 2)  # warm-up
        # The machine's speed drifts (a shared host): each repeat times the three back to back
        # and gives its own ratios; the median repeat is reported, with the range.
        runs = []
        for _ in range(repeats):
            one = seconds_per_position_one_forward(lm, k, h)
            with prompt_attention_clock() as spent:
                coupled = seconds_per_position_coupled(pair, k, h)
            floor = seconds_per_position_floor(lm, k, h)
            runs.append((coupled / one, coupled / floor, coupled, one, floor, spent[0] / h))
        runs.sort()
        ratio, floor_ratio, coupled, one, floor, prompt = runs[len(runs) // 2]
        print(f"n = {ids.shape[1]}: coupled step {1000 * coupled:.0f} ms / position; "
              f"ratio coupled / one forward = {ratio:.2f} (median of {repeats} repeats, range "
              f"{runs[0][0]:.2f}-{runs[-1][0]:.2f}), coupled / three-forward floor = "
              f"{floor_ratio:.2f} (that repeat: one forward {1000 * one:.0f} ms, floor "
              f"{1000 * floor:.0f} ms)")
        print(f"n = {ids.shape[1]}: of the coupled step, the attention over the prompt (both "
              f"sides, every layer) takes {1000 * prompt:.0f} ms: one forward plus that alone "
              f"is {(one + prompt) / one:.2f} x one forward")
        if n == lengths[0]:
            gen = seconds_per_position_generate(lm, ids, k, h)
            print(f"n = {ids.shape[1]}: generate({k} sampled sequences) {1000 * gen:.0f} ms / "
                  f"position; ratio coupled / generate = {coupled / gen:.2f}")
            ops, syncs, plain_ops, names = operators_per_position(lm, pair, k, 8)
            print(f"n = {ids.shape[1]}: operators per coupled position {ops:.0f}, one plain "
                  f"forward of {3 * k} rows {plain_ops} (ratio {ops / plain_ops:.2f}); host "
                  f"syncs per position {syncs:.2f} ({names}; 8 positions)")
            d_logits, d_logprobs = fused_against_separate(pair, k, 4 if q else 8)
            print(f"n = {ids.shape[1]}: joint step vs separate steps, largest |difference|: "
                  f"logits {d_logits:.1e}, log-probabilities {d_logprobs:.1e}")

    ids = encode_prompt(lm.tokenizer, prompt_text(lm.tokenizer, swrb_n))
    pair = LMKernelPair(lm, ids, "snapkv-90")
    runs = sorted((lambda r: (r["t_swrb"] / r["t_rollout"], r))(swrb_against_rollouts(
        pair, swrb_k, swrb_h)) for _ in range(repeats))
    time_ratio, s = runs[len(runs) // 2]
    var_ratio = s["var_rollout"] / s["var_swrb"] if s["var_swrb"] > 0 else float("inf")
    print(f"SWRB vs rollouts (n = {ids.shape[1]}, snapkv-90, K = {swrb_k}, H = {swrb_h}): "
          f"wall {s['t_swrb']:.1f} s vs {s['t_rollout']:.1f} s, ratio SWRB / rollout = "
          f"{time_ratio:.2f} (median of {repeats}, range {runs[0][0]:.2f}-{runs[-1][0]:.2f}); "
          f"rows through the model {s['rows_swrb']} vs {s['rows_rollout']} "
          f"({s['rows_swrb'] / s['rows_rollout']:.2f}x) in {s['calls_swrb']} vs "
          f"{s['calls_rollout']} calls; R {s['R_swrb']:.4f} vs {s['R_rollout']:.4f}; "
          f"per-replicate variance ratio rollout / SWRB = {var_ratio:.2f}; variance-per-time "
          f"advantage = {var_ratio / time_ratio:.2f}")

    text = prompt_text(lm.tokenizer, rss_n)
    n = encode_prompt(lm.tokenizer, text).shape[1]
    gib = peak_rss_of_run(text, rss_k, rss_h)
    print(f"peak resident memory of `kvdrift run --replicates {rss_k} --horizon {rss_h}` on one "
          f"{n}-token document (snapkv-half): {gib:.2f} GiB")
    print_setup(lm, setup_n)


if __name__ == "__main__":
    main()
