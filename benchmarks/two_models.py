"""A position of a two-model pair against one plain forward of each model, and its memory.

On the embedded SmolLM2 (P) and its Q4_0 copy (Q, ``full@int4``), on one ~1,000-token prompt
(``--quick``: 200), prints:

1. one coupled position (:func:`kvdrift.estimate.coupled_rollouts`, K rows, H positions: P
   steps X, Q steps Y and, once a row has diverged, Q along X) over the sum of one plain
   forward of each model on the rows a position can hold (P: K rows, Q: 2K rows;
   transformers' own forward, one new token per row against a cache of the prompt), the
   median of five repeats; goal: at most 1.2.
2. the same coupled position of the one-model pair (``snapkv-half`` on P's model: P and Q in
   one joint forward) over one plain forward of P's model on 3K rows, for comparison.
3. the peak resident memory of ``kvdrift run --actions full@int4`` (a separate process)
   against P's weights + Q's weights (Q's held dequantized at P's dtype) + the caches' bytes.

Run: ``python benchmarks/two_models.py`` (a few minutes on 2 CPU cores; ``--quick``: smaller).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from bench_engine import prompt_text  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from kvdrift.data.document import Document  # noqa: E402
from kvdrift.estimate import coupled_rollouts  # noqa: E402
from kvdrift.lm.factory import LMPairFactory  # noqa: E402
from kvdrift.lm.generators.weights import parameter_bytes  # noqa: E402
from kvdrift.lm.loading.model import encode_prompt, load_model  # noqa: E402


def plain_forward_seconds(model, ids: torch.Tensor, rows: int, repeats: int = 3) -> float:
    """One transformers forward of ``rows`` new tokens against a cache of the prompt."""
    with torch.no_grad():
        cache = DynamicCache()
        model(ids, past_key_values=cache, use_cache=True)
        cache.batch_repeat_interleave(rows)
        n = ids.shape[1]
        tokens = torch.randint(3, 1000, (rows, 1), generator=torch.Generator().manual_seed(0))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(tokens, past_key_values=cache, use_cache=True,
                  position_ids=torch.full((rows, 1), n), cache_position=torch.tensor([n]))
            times.append(time.perf_counter() - start)
            cache.crop(n)
    return min(times)


def coupled_position_seconds(pair, k: int, h: int) -> float:
    """Seconds per position of coupled rollouts at temperature 1."""
    start = time.perf_counter()
    coupled_rollouts(pair, k, h, temperature=1.0, seed=0)
    return (time.perf_counter() - start) / h


def peak_rss_of_run(text: str, k: int, h: int, action: str) -> float:
    """Peak resident memory (GiB) of a ``kvdrift run`` process on one document (the child
    reports its own high-water mark, so runs measured one after another do not mask each
    other)."""
    with tempfile.TemporaryDirectory() as tmp:
        docs = Path(tmp) / "doc.jsonl"
        docs.write_text(json.dumps({"id": "doc", "prompt": text}) + "\n")
        code = ("import resource, sys\nfrom kvdrift.cli import main\n"
                "sys.argv = ['kvdrift'] + sys.argv[1:]\ntry:\n    main()\n"
                "except SystemExit as exit:\n    assert not exit.code, exit.code\n"
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)")
        cmd = [sys.executable, "-c", code, "run", "--docs", str(docs), "--actions", action,
               "--replicates", str(k), "--horizon", str(h), "--out", str(Path(tmp) / "run"),
               "--json"]
        done = subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    return int(done.stderr.strip().splitlines()[-1]) / 2**20  # ru_maxrss: KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, to try the script")
    parser.add_argument("--memory", action="store_true", help="item 3 only")
    args = parser.parse_args()
    n_tokens, k, h = (200, 4, 8) if args.quick else (1000, 16, 16)
    torch.manual_seed(0)
    lm = load_model("smollm2")
    text = prompt_text(lm.tokenizer, n_tokens)
    ids = encode_prompt(lm.tokenizer, text)
    doc = Document(id="bench", prompt=text)
    factory = LMPairFactory(lm)
    two = factory(doc, "full@int4")
    q_model = two.generator.loaded.model
    one = factory(doc, "snapkv-half")
    print(f"prompt {ids.shape[1]} tokens, K = {k}, H = {h}")

    ratios, ratios_one = [], []
    for _ in range(0 if args.memory else 1 if args.quick else 5):
        coupled = coupled_position_seconds(two, k, h)
        plain = plain_forward_seconds(lm.model, ids, k) + plain_forward_seconds(q_model, ids, 2 * k)
        ratios.append(coupled / plain)
        coupled_one = coupled_position_seconds(one, k, h)
        ratios_one.append(coupled_one / plain_forward_seconds(lm.model, ids, 3 * k))
    if ratios:
        print(f"1. two models (full@int4): coupled position / (P's forward of K rows + Q's of "
              f"2K) = {statistics.median(ratios):.2f} (goal <= 1.2; median of {len(ratios)})")
        print(f"2. one model (snapkv-half): coupled position / P's forward of 3K rows "
              f"= {statistics.median(ratios_one):.2f}")

    weights = parameter_bytes(lm.model) + parameter_bytes(q_model)
    cache = sum(2 * k_.numel() * k_.element_size() for k_ in two.prompt_cache("p").keys)
    peak = peak_rss_of_run(text, k, h, "full@int4")
    base = peak_rss_of_run(text, k, h, "full")
    print(f"3. peak RSS of `kvdrift run --actions full@int4`: {peak:.2f} GiB; of `--actions "
          f"full` (one model): {base:.2f} GiB; P's + Q's weights {weights / 2**30:.2f} GiB, "
          f"both prompt caches {2 * cache / 2**30:.3f} GiB; peak over weights + caches "
          f"{peak / ((weights + 2 * cache) / 2**30):.2f}; two-model peak minus one-model peak "
          f"{peak - base:.2f} GiB (Q's weights: {parameter_bytes(q_model) / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
