"""A coupled position inside llama.cpp against llama.cpp's own batched decode of the same rows.

On the embedded SmolLM2 GGUF, one ~500-token prompt (``--quick``: 100), P with an f16 cache
and Q with q4_0 keys and values (``gguf:k=q4_0,v=q4_0``), prints for K replicates:

1. one coupled position (:func:`kvdrift.estimate.coupled_rollouts`, K rows, H positions: P
   steps X, Q steps Y and, once a row has diverged, Q along X) in milliseconds;
2. llama.cpp's own batched decode of the same work: the prompt in one sequence copied to
   2K sequences per side, then each position one ``llama_decode`` of K tokens in P's context
   and 2K in Q's, logits read back (what any program stepping those rows must run);
3. their ratio (goal: at most 1.3), the median of three repeats.

Run: ``python benchmarks/llama_engine.py`` (about a minute on 2 CPU cores; ``--quick``: smaller).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import numpy as np
import torch


def baseline(factory, prompt: list[int], K: int, H: int) -> float:
    """Seconds per position of llama.cpp's own decode of K rows in P's and 2K in Q's context."""
    from kvdrift.llamacpp.cache_types import LlamaAction
    from kvdrift.llamacpp.sequences import SequencePool

    lib = factory.lib
    vocab = None
    pools = []
    for key, action in (("bp", LlamaAction("full")), ("bq", LlamaAction("x", "q4_0", "q4_0"))):
        pool = factory._pool(key, factory.p_file, action, prompt, factory.slots)
        pools.append(pool)
        vocab = pool.vocab_size
    assert isinstance(pools[0], SequencePool)
    rows = {id(pools[0]): K, id(pools[1]): 2 * K}
    for pool in pools:
        for s in range(1, rows[id(pool)] + 1):
            lib.llama_memory_seq_cp(pool.memory, 0, s, -1, -1)
    started = time.perf_counter()
    for t in range(H):
        for pool in pools:
            n = rows[id(pool)]
            batch = lib.llama_batch_init(n, 0, 1)
            for i in range(n):
                batch.token[i] = 100 + i
                batch.pos[i] = len(prompt) + t
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = i + 1
                batch.logits[i] = 1
            batch.n_tokens = n
            assert lib.llama_decode(pool.context, batch) == 0
            for i in range(n):
                pointer = lib.llama_get_logits_ith(pool.context, i)
                np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)),
                                      shape=(vocab,)).copy()
            lib.llama_batch_free(batch)
    return (time.perf_counter() - started) / H


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from kvdrift.data.document import Document
    from kvdrift.estimate.rollout import coupled_rollouts
    from kvdrift.llamacpp.factory import LlamaCppFactory
    from kvdrift.lm.loading.model import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    words = 100 if args.quick else 500
    H = 16 if args.quick else 32
    doc = Document(id="bench", prompt="The river runs past the old mill. " * (words // 8))
    print(f"llama.cpp engine, SmolLM2 GGUF, gguf:k=q4_0,v=q4_0, H = {H}")
    print(f"{'K':>3} {'coupled ms':>11} {'llama.cpp ms':>13} {'ratio':>6}")
    for K in (4, 8):
        coupled, plain = [], []
        for repeat in range(3):
            factory = LlamaCppFactory("smollm2", tokenizer, horizon=H, rows=K)
            pair = factory(doc, "gguf:k=q4_0,v=q4_0")
            prompt = [int(t) for t in factory.prompt_ids(doc).reshape(-1)]
            started = time.perf_counter()
            coupled_rollouts(pair, K, H, temperature=1.0, seed=torch.Generator().manual_seed(
                repeat))
            coupled.append((time.perf_counter() - started) / H)
            plain.append(baseline(factory, prompt, K, H))
            factory.close()
        c, p = statistics.median(coupled), statistics.median(plain)
        print(f"{K:>3} {1e3 * c:>11.1f} {1e3 * p:>13.1f} {c / p:>6.2f}")


if __name__ == "__main__":
    main()
