"""Memory and time of a long generation: full cache against a decoding-time press (issue 49).

For each mode a fresh process loads the embedded SmolLM2-135M (float32, CPU), prefills a
``--prompt``-token document and steps ``--rows`` rows along fixed random tokens to the longest
horizon, one decoding step per position:

- ``full``: P's rows (the full cache: every generated entry stays);
- ``press``: Q's rows under ``decoding-knorm:interval=I,target=T`` started with
  ``rewind=False`` (lm/engine/live_rows.py: a row holds what the press keeps);
- ``masked`` (to H = 1,024 by default): the same press with ``rewind=True`` (every slot kept
  and masked: kvdrift before issue 49, and what SWRB's states still hold so that its branches
  can go back).

The modes run at once, one process and one thread each. At H = 256, 1,024 and 4,096 it prints
the seconds per position (mean of the 32 steps before H; CPU seconds of the process, which the
other work on a shared machine distorts less than wall seconds, and wall seconds), the bytes
the rows' state holds at its peak up to H (generated keys and values with their spare slots,
masks, attention inputs, token history: everything per row; the shared prompt is printed once,
it does not depend on H) and what the process holds: its peak resident memory up to H
(``VmHWM``, reset through ``/proc/self/clear_refs`` before the first step) and that peak above
its resident memory before the first step. The child's C allocator is left as a kvdrift run
has it (``import kvdrift`` fixes glibc's mmap threshold at 8 MiB; an earlier version of this
script set ``MALLOC_MMAP_THRESHOLD_=131072``, which hid the heap growth of issue 60), and its
states are started as the rollouts start theirs (``slots``: full caches allocated once for
the horizon). Then the ratios to H = 256 (goal under the press: at most 1.3x for time and
memory at H = 4,096; the full mode's memory grows with H by construction), the state-bytes formula
(:func:`state_bytes`) against the measurement (goal: within 15%), and that formula at
Llama-3-8B's shape (32 layers, 8 KV heads, head_dim 128, hidden 4096, bfloat16) with a 32K
prompt: what one replicate of a rollout holds (P's row full, Q along Y and Q forced along X
under the press) and how many replicates fit one 80 GB batch (``--batch``).

Run: ``nice python benchmarks/long_horizon.py`` (about 30 minutes on 2 idle CPU cores);
``--quick`` (H = 64, 128, 256 with T = 32, I = 16) to try it; ``--layers 4`` keeps the
model's first 4 layers (every per-position cost but the cache entries' size; about 6 minutes).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

GIB = 2**30
MIB = 2**20
MODES = ("full", "press", "masked")
WINDOW = 32  # steps averaged for the seconds per position at H


@dataclass(frozen=True)
class Shape:
    """What a row's state depends on: the model's cache shape and the press."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    bytes: int  # the cache's element size
    target: int  # T: entries the press keeps
    interval: int  # I: steps between compressions
    window: int  # attention inputs a compression scores from: min(I, buffer + 1)

    @property
    def entry(self) -> int:
        """Bytes of one cache entry (keys and values of every layer and KV head)."""
        return self.layers * self.kv_heads * self.head_dim * 2 * self.bytes


SMOLLM2 = Shape(layers=30, kv_heads=3, head_dim=64, hidden=576, vocab=49152, bytes=4,
                target=256, interval=128, window=128)
LLAMA_8B = Shape(layers=32, kv_heads=8, head_dim=128, hidden=4096, vocab=128256, bytes=2,
                 target=256, interval=128, window=128)
LLAMA_8B_WEIGHTS = 8_030_261_248 * 2  # Llama-3-8B's parameters in bfloat16


def spare(slots: int) -> int:
    """Spare slots a buffer holding ``slots`` entries allocates (lm/engine/cache.py)."""
    return max(32, slots // 8)


def slot_capacity(s: Shape, mode: str, h: int, prompt: int, reserve: int = 0
                  ) -> tuple[int, int]:
    """(generated slots held at length ``h``, the largest buffer capacity up to ``h``): the
    growth rule of lm/engine/cache.py replayed step by step (a compression of the ``press``
    mode writes its kept entries to new buffers of ``kept + spare``)."""
    # a row keeping every entry starts with ``reserve`` slots (rows under the press do not)
    cap = max(spare(0), 0 if mode == "press" else reserve)
    slots, peak = 0, cap
    for length in range(1, h + 1):
        slots += 1
        if slots > cap:
            cap = slots + spare(slots)
        if mode == "press" and length % s.interval == 0:
            live = slots + (prompt if length == s.interval else 0)
            slots = min(live, max(s.target, 1))
            cap = slots + spare(slots)
        peak = max(peak, cap)
    return slots, peak


def doubled(h: int, start: int = 16) -> int:
    """A history grown by ``max(16, size)`` whenever full (tokens; the masked mode's inputs)."""
    size = 0
    while size <= h:
        size += max(start, size)
    return size


def state_bytes(s: Shape, mode: str, h: int, prompt: int, reserve: int = 0) -> dict[str, int]:
    """The per-row tensors of a state at their peak up to length ``h`` (the shared prompt is
    not counted: it is stored once)."""
    slots, cap = slot_capacity(s, mode, h, prompt, reserve)
    base = {"keys and values": s.entry * cap, "slot mask and steps int64": 16 * slots,
            "tokens int64": 8 * doubled(h - 1), "logits float32": 4 * s.vocab}
    if mode == "full":
        return base
    if mode == "masked":
        return {**base,
                "eviction steps (prompt and generated) int32":
                    4 * s.layers * s.kv_heads * (prompt + h),
                "attention inputs of every step": s.layers * doubled(h - 1) * s.hidden * s.bytes,
                "cache orders [kv, J, T] int32":
                    4 * s.layers * s.kv_heads * (h // s.interval) * s.target}
    return {**base, "held-slot masks": s.layers * s.kv_heads * slots,
            "attention inputs (a ring of the last steps)": s.layers * s.window * s.hidden * s.bytes}


def _status(field: str) -> int:
    """A field of ``/proc/self/status`` in bytes (VmRSS, VmHWM)."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024


def held_bytes(state) -> int:
    """Bytes a path state holds per its own tensors (the shared prompt excluded)."""
    tensors = [state.mask, state.slot_step, state.tokens, state.lengths, state.logits, state.stale]
    for layer in state.cache.layers:
        tensors += [layer._key_buf, layer._value_buf]
    ev = state.evictions
    if ev is not None:
        for name in ("prompt", "own", "inputs", "order"):
            tensors += list(getattr(ev, name, ()))
        tensors += [t for t in (getattr(ev, "reads_prompt", None), getattr(ev, "last", None))
                    if t is not None]
    seen, total = set(), 0
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def child(mode: str, args: argparse.Namespace) -> dict:
    """One mode in this process (run by :func:`main` in a fresh one)."""
    import torch

    from kvdrift.lm.engine.pair import LMKernelPair
    from kvdrift.lm.loading.model import load_model

    torch.set_num_threads(args.threads)
    lm = load_model("smollm2")
    if args.layers < SMOLLM2.layers:  # the first layers only (every per-position cost but theirs)
        lm.model.model.layers = torch.nn.ModuleList(list(lm.model.model.layers)[:args.layers])
        lm.model.config.num_hidden_layers = args.layers
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 40000, (1, args.prompt), generator=gen)
    spec = f"decoding-knorm:interval={args.interval},target={args.target}"
    pair = LMKernelPair(lm, ids, spec)
    side = "p" if mode == "full" else "q"
    horizons = sorted(args.horizons)
    state = pair.start(side, args.rows, rewind=mode == "masked", slots=horizons[-1])
    prompt_bytes = sum(t.untyped_storage().nbytes() for t in pair.prompt_cache(side).keys) * 2
    tokens = torch.randint(3, 40000, (horizons[-1], args.rows), generator=gen)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    seconds, cpu, peak, out = [], [], 0, {}
    for t in range(horizons[-1]):
        started, started_cpu = time.perf_counter(), time.process_time()
        state = pair.advance(state, tokens[t])
        pair.logprobs(state)
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        peak = max(peak, held_bytes(state))
        if t + 1 in horizons:
            out[t + 1] = {"seconds": sum(seconds[-WINDOW:]) / len(seconds[-WINDOW:]),
                          "cpu": sum(cpu[-WINDOW:]) / len(cpu[-WINDOW:]),
                          "state": peak, "rss": _status("VmHWM") - before,
                          "peak": _status("VmHWM"),
                          "slots": state.cache.get_seq_length()}
            if args.partial is not None:  # what is measured so far, should the run be stopped
                result = {"mode": mode, "prompt_bytes": prompt_bytes, "at": out}
                Path(args.partial, f"{mode}.json").write_text(json.dumps(result))
    return {"mode": mode, "prompt_bytes": prompt_bytes, "at": out}


def measure(runs: dict[str, list[str]]) -> dict[str, dict]:
    """:func:`child` of each mode in a fresh process, all at once (each one thread: the
    seconds per position are CPU seconds of the process, which other processes on the
    machine slow less than wall time)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    procs = {mode: subprocess.Popen([sys.executable, __file__, "--child", mode, *argv], env=env,
                                    stdout=subprocess.PIPE, text=True)
             for mode, argv in runs.items()}
    results = {}
    for mode, proc in procs.items():
        stdout, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"the {mode} measurement failed (exit {proc.returncode})")
        results[mode] = json.loads(stdout.strip().splitlines()[-1])
    return results


def fits_80gb(s: Shape, h: int, prompt: int) -> dict[str, float]:
    """Per replicate of a rollout (P's row full; Q along Y and Q forced along X under the
    press, or masked as before issue 49) and the replicates one 80 GB batch holds."""
    workspace = s.vocab * (4 + 6 * 8)  # a row's logits float32 and ~6 float64 [V] copies
    free = 80e9 - LLAMA_8B_WEIGHTS - s.entry * prompt - 2 * GIB  # weights, prompt, CUDA
    out = {}
    for q_mode in ("press", "masked"):
        per = (sum(state_bytes(s, "full", h, prompt).values())
               + 2 * sum(state_bytes(s, q_mode, h, prompt).values()) + 3 * workspace)
        out[q_mode] = (per, int(free // per))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="H = 64, 128, 256; T = 32, I = 16")
    parser.add_argument("--rows", type=int, default=1, help="rows per state (K)")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--threads", type=int, default=1, help="threads of each process")
    parser.add_argument("--layers", type=int, default=SMOLLM2.layers,
                        help="decoder layers kept, the first ones (default: all 30)")
    parser.add_argument("--masked-up-to", type=int, default=1024,
                        help="longest H of the masked mode (it grows with H; default 1024)")
    parser.add_argument("--save", default=None, help="write the measurements to this JSON file")
    parser.add_argument("--load", default=None, help="print saved measurements, measure nothing")
    parser.add_argument("--partial", default=None,
                        help="a folder where each mode writes what it measured so far")
    parser.add_argument("--print-partial", action="store_true",
                        help="print what the modes wrote to --partial, measure nothing")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--target", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--horizons", type=int, nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target is None:
        args.target, args.interval = (32, 16) if args.quick else (256, 128)
    if args.horizons is None:
        args.horizons = [64, 128, 256] if args.quick else [256, 1024, 4096]
    if args.child is not None:
        print(json.dumps(child(args.child, args)))
        return
    if not 1 <= args.layers <= SMOLLM2.layers:
        parser.error(f"--layers {args.layers}: SmolLM2-135M has {SMOLLM2.layers} decoder "
                     f"layers (1-{SMOLLM2.layers})")
    argv = ["--rows", str(args.rows), "--prompt", str(args.prompt), "--threads",
            str(args.threads), "--layers", str(args.layers), "--target", str(args.target),
            "--interval", str(args.interval),
            *(["--partial", args.partial] if args.partial is not None else [])]
    shape = replace(SMOLLM2, layers=args.layers, target=args.target, interval=args.interval,
                    window=min(args.interval, 257))
    hs = sorted(args.horizons)
    cut = "" if args.layers == SMOLLM2.layers else f" cut to its first {args.layers} layers"
    print(f"SmolLM2-135M{cut} float32, CPU ({args.threads} threads), prompt {args.prompt} tokens, "
          f"K = {args.rows} row(s); press decoding-knorm:interval={args.interval},"
          f"target={args.target}")
    if args.load is not None:  # print a saved measurement again (e.g. with a new formula)
        results = json.loads(Path(args.load).read_text())
    elif args.partial is not None and args.print_partial:
        results = {m: json.loads(Path(args.partial, f"{m}.json").read_text()) for m in MODES}
    else:
        started = time.perf_counter()
        results = measure({mode: [*argv, "--horizons", *map(str, [
            h for h in args.horizons if mode != "masked" or h <= args.masked_up_to])]
            for mode in MODES})
        print(f"  measured in {time.perf_counter() - started:.0f} s", flush=True)
        if args.save is not None:
            Path(args.save).write_text(json.dumps(results))
    print(f"\nshared prompt (P's, stored once): "
          f"{results['full']['prompt_bytes'] / MIB:.1f} MiB\n")
    print("| mode | H | CPU s / position | wall s / position | state MiB (peak) | formula MiB "
          "| formula / measured | peak RSS MiB | RSS growth MiB | slots held |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for mode in MODES:
        for h in hs:
            if str(h) not in results[mode]["at"]:
                continue
            r = results[mode]["at"][str(h)]
            reserve = max(int(k) for k in results[mode]["at"])  # slots= of the mode's start
            formula = sum(state_bytes(shape, mode, h, args.prompt, reserve).values()) * args.rows
            ratio = formula / r["state"]
            worst = max(worst, abs(ratio - 1))
            print(f"| {mode} | {h:,} | {r['cpu']:.4f} | {r['seconds']:.4f} | "
                  f"{r['state'] / MIB:.2f} | "
                  f"{formula / MIB:.2f} | {ratio:.2f} | {r.get('peak', math.nan) / MIB:.0f} | "
                  f"{r['rss'] / MIB:.1f} | {r['slots']} |")
    print(f"\nratios to H = {hs[0]:,}:")
    for mode in MODES:
        top = max(int(h) for h in results[mode]["at"])
        a, b = results[mode]["at"][str(hs[0])], results[mode]["at"][str(top)]
        print(f"  {mode}, H = {top:,}: CPU time {b['cpu'] / a['cpu']:.2f}x (wall "
              f"{b['seconds'] / a['seconds']:.2f}x), state "
              f"{b['state'] / a['state']:.2f}x, peak RSS "
              f"{b.get('peak', math.nan) / a.get('peak', math.nan):.2f}x, RSS growth "
              f"{b['rss'] / max(a['rss'], 1):.2f}x")
    print(f"state formula against the measurement: largest gap {100 * worst:.1f}% "
          f"(goal: within 15%)")
    big = LLAMA_8B
    prompt = 32768
    print(f"\nLlama-3-8B shape (bfloat16, entry {big.entry / 1024:.0f} KiB), prompt {prompt:,} "
          f"tokens (shared, {big.entry * prompt / GIB:.1f} GiB), press T = {big.target}, "
          f"I = {big.interval}: per-row state bytes")
    print("| H | full MiB | press MiB | masked (before issue 49) MiB |")
    print("| --- | --- | --- | --- |")
    for h in (256, 1024, 4096):
        cells = [sum(state_bytes(big, m, h, prompt).values()) / MIB for m in MODES]
        print(f"| {h:,} | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")
    fit = fits_80gb(big, 4096, prompt)
    print(f"\nat H = 4,096, one replicate of a rollout holds {fit['press'][0] / GIB:.2f} GiB "
          f"(P full, two Q rows under the press): --batch {fit['press'][1]} fits 80 GB beside "
          f"the weights ({LLAMA_8B_WEIGHTS / GIB:.1f} GiB) and the prompt; before issue 49 "
          f"({fit['masked'][0] / GIB:.2f} GiB per replicate) --batch {fit['masked'][1]}. "
          f"K is not bounded by memory (batches run one after another).")


if __name__ == "__main__":
    main()
