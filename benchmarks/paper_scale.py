"""The method's protocol at the method's scale: one (document, action) unit on an 8B-shaped model.

Builds a Llama with Llama-3.1-8B's dimensions from a config in code (random weights, no
download), a random prompt of 32K tokens, and runs one unit of kvdrift's rollout estimator
with snapkv-half, K = 64, H = 128 (three paths in one joint step per position), then prints
the seconds per unit and the peak accelerator memory. Every size is an option, so the script
can be tried on a CPU first::

    python benchmarks/paper_scale.py                        # full size, needs a large GPU
    python benchmarks/paper_scale.py --device cpu --dtype float32 --layers 2 --hidden 256 \\
        --intermediate 512 --heads 8 --kv-heads 2 --vocab 4096 --prompt-tokens 2048 --K 8 --H 8
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kvdrift.estimate import coupled_rollouts
from kvdrift.lm.pair import LMKernelPair

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    args = parser.parse_args()
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    cuda = device.type == "cuda"

    torch.manual_seed(args.seed)
    start = time.perf_counter()
    with device:
        model = LlamaForCausalLM(llama_8b_shaped(args)).to(dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e9:.2f} B parameters, {args.dtype}, on {device} "
          f"(built in {time.perf_counter() - start:.0f} s)")
    ids = torch.randint(0, 128000 if args.vocab > 128000 else args.vocab, (1, args.prompt_tokens),
                        generator=torch.Generator().manual_seed(args.seed)).to(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    pair = LMKernelPair(model, ids, args.action)
    if cuda:
        torch.cuda.synchronize(device)
    prefill = time.perf_counter() - start
    print(f"prompt: {args.prompt_tokens} tokens; {args.action} keeps "
          f"{pair.prompt_cache('q').kept}; two prefills: {prefill:.1f} s")
    start = time.perf_counter()
    result = coupled_rollouts(pair, args.K, args.H, seed=args.seed)
    if cuda:
        torch.cuda.synchronize(device)
    unit = time.perf_counter() - start
    print(f"unit ({args.action}, K = {args.K}, H = {args.H}, three paths): {unit:.1f} s "
          f"({unit / args.H:.2f} s / position), plus the prefills: {unit + prefill:.1f} s; "
          f"P(tau <= H) = {float((result.tau > 0).double().mean()):.2f}")
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        print(f"peak accelerator memory: {peak:.1f} GiB")
    print(f"peak resident memory (host): "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
