"""What ``--attribution`` adds to peak memory against the prompt length, before and after issue 45.

For each prompt length (8K, 16K and 32K tokens by default) and each algorithm, a fresh process
builds a tiny random Llama (4 layers, hidden 64, 4 query and 2 KV heads), prefills a random
prompt with snapkv-half (P's and Q's prompt caches), then resets its peak resident memory
(``/proc/self/clear_refs``) and runs the attribution of 8 divergent histories of 16, 32, ..., 128
tokens. The memory the attribution adds is the peak resident memory (``VmHWM``) less the
resident memory before it (``VmRSS``): PyTorch's CPU tensors are resident memory (tracemalloc
does not see them), and the child's malloc returns every large block to the system when freed
(``MALLOC_MMAP_THRESHOLD_``), so memory freed by the prefill cannot hide the attribution's.

"before" is the algorithm of kvdrift before issue 45 (``tests/attribution_reference.py``: a
``[kv_heads, kept, n]`` distance matrix per layer, and a replay with every layer's attention
weights of every query, on a copy of P's prompt cache per history); "after" is
:mod:`kvdrift.lm.attribution`. Prints the table, the growth per doubling of the prompt, whether
both rank the same positions with masses within 1e-6, and each algorithm's dominant tensors
(:func:`before_bytes`, :func:`after_bytes`: beside the measurement on the tiny model, then
projected to Llama-3.1-8B's shape in bfloat16 at 32K tokens with H = 128).

Run: ``nice python benchmarks/attribution_memory.py`` (about 5 minutes on 2 CPU cores, about
5 GiB at the peak: the old algorithm at 32K tokens; one process at a time).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

GIB = 2**30
ALGORITHMS = ("before", "after")


@dataclass(frozen=True)
class Shape:
    """What the attribution's memory depends on: the model, the prompt, the histories."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    bytes: int  # the model's element size
    n: int  # prompt tokens
    kept: int  # entries Q's cache keeps per layer and KV head
    histories: int  # divergent histories of the unit
    rows: int  # histories per replay forward
    longest: int  # tokens of the longest history (H at most)


TINY = Shape(layers=4, heads=4, kv_heads=2, head_dim=16, hidden=64, intermediate=128, vocab=256,
             bytes=4, n=0, kept=0, histories=8, rows=8, longest=128)
LLAMA_8B = Shape(layers=32, heads=32, kv_heads=8, head_dim=128, hidden=4096, intermediate=14336,
                 vocab=128256, bytes=2, n=32768, kept=16384, histories=8, rows=8, longest=128)


def before_bytes(s: Shape) -> dict[str, int]:
    """The old algorithm's dominant tensors at its peak (the replay; the distance matrix's
    layer comes first and is freed before it, so the peak is the larger of the two phases)."""
    t = s.longest + 1  # the last prompt token and the history
    weights = {  # kept from the replay to the masses
        "one layer's distances [kv, kept, n] float32": s.kv_heads * s.kept * s.n * 4,
        "loss weights [layers, kv, n] float64": s.layers * s.kv_heads * s.n * 8,
    }
    replay = {
        "P's cache copied per history [layers, r, kv, n, d] x2":
            2 * s.layers * s.rows * s.kv_heads * (s.n + t) * s.head_dim * s.bytes,
        "every layer's weights of every query [layers, r, heads, t, n + t]":
            s.layers * s.rows * s.heads * t * (s.n + t) * s.bytes,
        "one layer's eager scores and softmax [r, heads, t, n + t] x2":
            2 * s.rows * s.heads * t * (s.n + t) * 4,
        "last-query weights and their product [R, layers, heads, n] float64 x3":
            3 * s.histories * s.layers * s.heads * s.n * 8,
        "loss weights [layers, kv, n] float64": s.layers * s.kv_heads * s.n * 8,
    }
    return max(weights, replay, key=lambda terms: sum(terms.values()))


def after_bytes(s: Shape) -> dict[str, int]:
    """The new algorithm's dominant tensors at its peak (module docstring of
    :mod:`kvdrift.lm.attribution`): the larger of the matching phase and the replay."""
    from_words = min(s.n, 4096) * s.kv_heads * s.head_dim * s.bytes  # HASH_ENTRIES entries
    matching = {
        "one layer's entries [kv, n, 2d] and their hashes, order [kv, n] int64 x3":
            s.kv_heads * s.n * (2 * s.head_dim * s.bytes + 3 * 8),
        "a chunk's hash products (int64 per 16-bit word) x2": 2 * from_words * 8,
        "held and matched entries [kv, kept, 2d] float64 x2":
            2 * s.kv_heads * s.kept * 2 * s.head_dim * 8,
        "loss weights [layers, kv, n] float64": s.layers * s.kv_heads * s.n * 8,
    }
    t = s.longest + 1
    replay = {
        "one layer's last-query scores and weights [r, heads, n] float32 x3, float64 x2":
            s.rows * s.heads * s.n * (3 * 4 + 2 * 8),
        "one layer's prompt keys in float32 [kv, n, d] (bfloat16 models)":
            s.kv_heads * s.n * s.head_dim * 4 if s.bytes < 4 else 0,
        "the forward's activations [r, t, 4 hidden + 3 intermediate]":
            s.rows * t * (4 * s.hidden + 3 * s.intermediate) * s.bytes,
        "the steps' logits [r, r, vocab] float32": s.rows * s.rows * s.vocab * 4,
        "masses [R, n] float64": s.histories * s.n * 8,
        "loss weights [layers, kv, n] float64": s.layers * s.kv_heads * s.n * 8,
    }
    return max(matching, replay, key=lambda terms: sum(terms.values()))


def _status(field: str) -> int:
    """A field of ``/proc/self/status`` in bytes (VmRSS, VmHWM)."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def child(n: int, algorithm: str, shape: Shape) -> dict:
    """One measurement in this process (run by :func:`main` in a fresh one)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvdrift.lm import attribution
    from kvdrift.lm.engine.pair import LMKernelPair

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import attribution_reference

    config = LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, max_position_embeddings=n + shape.longest + 8,
        initializer_range=0.2, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(n)
    ids = torch.randint(3, shape.vocab, (n,), generator=gen)
    pair = LMKernelPair(model, ids, "snapkv-half")
    p, q = pair.prompt_cache("p"), pair.prompt_cache("q")
    step = shape.longest // shape.histories
    histories = [torch.randint(3, shape.vocab, (step * (i + 1),), generator=gen)
                 for i in range(shape.histories)]
    run = attribution.lost_contexts if algorithm == "after" else attribution_reference.lost_contexts
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident memory starts again here
    before = _status("VmRSS")
    started = time.perf_counter()
    found = run(model, p, q, ids, histories)
    seconds = time.perf_counter() - started
    return {"n": n, "algorithm": algorithm, "kept": q.kept, "added": _status("VmHWM") - before,
            "seconds": seconds, "positions": [list(c.positions) for c in found],
            "shares": [list(c.shares) for c in found], "masses": [c.lost_mass for c in found]}


def measure(n: int, algorithm: str) -> dict:
    """:func:`child` in a fresh process (inheriting this one's niceness)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072",
               OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run([sys.executable, __file__, "--child", str(n), algorithm], env=env,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def same_answers(a: dict, b: dict) -> bool:
    """Positions identical, shares and total masses within 1e-6."""
    close = all(abs(x - y) <= 1e-6 for sa, sb in zip(a["shares"], b["shares"], strict=True)
                for x, y in zip(sa, sb, strict=True))
    return a["positions"] == b["positions"] and close and all(
        abs(x - y) <= 1e-6 for x, y in zip(a["masses"], b["masses"], strict=True))


def print_terms(title: str, terms: dict[str, int]) -> None:
    print(f"  {title}: {sum(terms.values()) / GIB:.2f} GiB")
    for name, size in sorted(terms.items(), key=lambda kv: -kv[1]):
        print(f"    {size / GIB:8.3f} GiB  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 32768],
                        help="prompt lengths in tokens, each twice the one before")
    parser.add_argument("--only", choices=ALGORITHMS, help="measure one algorithm")
    parser.add_argument("--child", nargs=2, metavar=("N", "ALGORITHM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1], TINY)))
        return
    algorithms = (args.only,) if args.only else ALGORITHMS
    results = {}
    print(f"attribution's added peak memory, tiny random Llama ({TINY.layers} layers, "
          f"{TINY.heads} heads, {TINY.kv_heads} KV heads), snapkv-half, {TINY.histories} "
          f"histories of up to {TINY.longest} tokens, {TINY.rows} per forward")
    print(f"{'tokens':>7} {'algorithm':>9} {'added MiB':>10} {'model MiB':>10} {'seconds':>8}")
    for n in args.sizes:
        for algorithm in algorithms:
            r = results[n, algorithm] = measure(n, algorithm)
            shape = replace(TINY, n=n, kept=r["kept"])
            model = before_bytes(shape) if algorithm == "before" else after_bytes(shape)
            print(f"{n:>7} {algorithm:>9} {r['added'] / 2**20:>10.0f} "
                  f"{sum(model.values()) / 2**20:>10.0f} {r['seconds']:>8.1f}", flush=True)
    for algorithm in algorithms:
        growth = [results[b, algorithm]["added"] / results[a, algorithm]["added"]
                  for a, b in zip(args.sizes, args.sizes[1:], strict=False)]
        print(f"growth per doubling, {algorithm}: " + ", ".join(f"x{g:.2f}" for g in growth))
    if len(algorithms) == 2:
        same = all(same_answers(results[n, "before"], results[n, "after"]) for n in args.sizes)
        print(f"same positions, shares and masses within 1e-6 at every length: {same}")
    print(f"projection, Llama-3.1-8B's shape in bfloat16, {LLAMA_8B.n} tokens, half kept, "
          f"{LLAMA_8B.histories} histories of up to H = {LLAMA_8B.longest} tokens:")
    print_terms("before", before_bytes(LLAMA_8B))
    print_terms("after", after_bytes(LLAMA_8B))


if __name__ == "__main__":
    main()
