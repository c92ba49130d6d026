"""The method's protocol at the method's scale: one (document, action) unit on an 8B-shaped model.

Builds a Llama with Llama-3.1-8B's dimensions from a config in code (random weights, no
download; the final norm scaled x6 so next-token distributions are peaked like a trained
model's), a random prompt of 32K tokens, and runs one unit of kvdrift's rollout estimator with
snapkv-half, K = 64, H = 128 (three paths in one joint step per position). Prints, in one run:

- the set-up (P's and Q's prompt caches) against one plain forward of the prompt;
- seconds per position against one plain forward of the same rows without cache, and against
  the weights alone (every weight matrix multiplied once by the same rows);
- operators and host synchronisations per position (``dispatch_count.py``; a short extra run,
  since counting slows the host);
- SWRB's wall time against the rollouts';
- peak memory (accelerator, and the host's resident memory).

Every size is an option; ``--quick`` runs a small model on the CPU in about a minute::

    python benchmarks/paper_scale.py                 # full size, needs a large GPU
    python benchmarks/paper_scale.py --quick         # CPU, float32, small sizes
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import torch
from dispatch_count import RowCounter, coupled_and_plain
from transformers import LlamaConfig, LlamaForCausalLM

from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.lm.engine.pair import LMKernelPair

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
QUICK = dict(device="cpu", dtype="float32", layers=8, hidden=512, intermediate=1536, heads=8,
             kv_heads=2, vocab=8192, prompt_tokens=2048, K=16, H=16)


def llama_8b_shaped(args: argparse.Namespace) -> LlamaConfig:
    """Llama-3.1-8B's dimensions (overridable), RoPE scaling as the release configures it."""
    return LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=128009, tie_word_embeddings=False,
        attn_implementation="sdpa", initializer_range=0.02,
    )


def clock(device: torch.device) -> Callable[[], float]:
    """``time.perf_counter`` after the device's queue has drained."""
    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()
    return now


def median_seconds(fn: Callable[[], object], now: Callable[[], float], repeats: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = now()
        fn()
        times.append(now() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes on the CPU")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--prompt-tokens", type=int, default=32000)
    parser.add_argument("--action", default="snapkv-half")
    parser.add_argument("--K", type=int, default=64, help="replicates")
    parser.add_argument("--H", type=int, default=128, help="generated positions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-swrb", action="store_true", help="skip SWRB against rollouts")
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    cuda = device.type == "cuda"
    now = clock(device)

    torch.manual_seed(args.seed)
    start = now()
    with device:
        model = LlamaForCausalLM(llama_8b_shaped(args)).to(dtype).eval()
        model.model.norm.weight.data.mul_(6.0)  # peaked next-token distributions
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e9:.2f} B parameters, {args.layers} layers, {args.dtype}, on "
          f"{device} ({torch.get_num_threads()} CPU threads; built in {now() - start:.0f} s)")
    ids = torch.randint(0, min(args.vocab, 128000), (1, args.prompt_tokens),
                        generator=torch.Generator().manual_seed(args.seed)).to(device)

    with torch.no_grad():
        plain_prefill = median_seconds(lambda: model(input_ids=ids, logits_to_keep=1), now,
                                       repeats=2)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start = now()
    pair = LMKernelPair(model, ids, args.action)
    setup = now() - start
    print(f"set-up ({args.prompt_tokens}-token prompt, {args.action} keeps "
          f"{pair.prompt_cache('q').kept}): {setup:.2f} s; one plain forward of the prompt "
          f"{plain_prefill:.2f} s; ratio {setup / plain_prefill:.2f}")

    rows = RowCounter(pair)
    start = now()
    result = coupled_rollouts(pair, args.K, args.H, seed=args.seed)
    unit = now() - start
    per_position = unit / args.H
    mean_rows = round(rows.rows / max(rows.calls, 1))
    print(f"unit ({args.action}, K = {args.K}, H = {args.H}, three paths): {unit:.2f} s, "
          f"{1000 * per_position:.1f} ms / position, {mean_rows} rows per step on average; "
          f"P(tau <= H) = {float((result.tau > 0).double().mean()):.2f}")

    x = torch.randint(0, min(args.vocab, 128000), (mean_rows, 1), device=device)
    with torch.no_grad():
        plain = median_seconds(lambda: model(input_ids=x, use_cache=False), now)
        hidden = torch.randn(mean_rows, args.hidden, device=device, dtype=dtype)
        middle = torch.randn(mean_rows, args.intermediate, device=device, dtype=dtype)
        linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]

        def weights_alone() -> None:
            for w in linears:
                (middle if w.shape[1] == args.intermediate else hidden) @ w.T

        weights = median_seconds(weights_alone, now)
    print(f"per position: {1000 * per_position:.1f} ms; one plain forward of {mean_rows} rows "
          f"without cache {1000 * plain:.1f} ms (ratio {per_position / plain:.2f}); the "
          f"{len(linears)} weight matrices once by {mean_rows} rows {1000 * weights:.1f} ms "
          f"(ratio {per_position / weights:.2f})")

    count_h = min(args.H, 8)
    counts, plain_counts = coupled_and_plain(model, pair, args.K, count_h, x, args.seed)
    print(f"operators per position {counts.ops / count_h:.0f} "
          f"({counts.ops / count_h / args.layers:.1f} per layer), one plain forward "
          f"{plain_counts.ops} (ratio {counts.ops / count_h / plain_counts.ops:.2f}); host "
          f"syncs per position {counts.syncs / count_h:.2f} ({dict(counts.sync_names)}; "
          f"over {count_h} positions)")

    if not args.no_swrb:
        start = now()
        swrb(pair, args.K, args.H, seed=args.seed)
        t_swrb = now() - start
        print(f"SWRB {t_swrb:.2f} s against rollouts {unit:.2f} s: ratio {t_swrb / unit:.2f}")
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        print(f"peak accelerator memory (set-up and estimators): {peak:.1f} GiB")
    print(f"peak resident memory (host): "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
