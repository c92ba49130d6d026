"""What the general path costs: set-up time per action against the shared prefill, one run.

For one document and a set of named actions, the pairs of every action are built twice on one
loaded model: by the shared prefill (the actions announced with ``prepare``, so one forward
serves P and every action), and by the general path (each action given as its own kvpress press
object, ``action.make_press(n)``: P's shared prefill, then one prefill inside each press, as
kvpress runs it). Prints the set-up time per action of each (median of ``--repeats`` runs of
the whole document) and their ratio, then the general path's time for kvpress classes only it
measures (ThinK, merging, SimLayerKV, Compactor, KVCompose), as ratios to the shared prefill's
per-action time.

Run: ``python benchmarks/general_path.py`` (a random 4-layer Llama, seconds) or
``python benchmarks/general_path.py --model smollm2`` (the embedded model, about a minute).
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

from kvdrift.data.document import Document  # noqa: E402
from kvdrift.lm.actions.spec import parse_action  # noqa: E402
from kvdrift.lm.factory import LMPairFactory  # noqa: E402
from kvdrift.lm.loading.model import LoadedModel, load_model, load_tokenizer  # noqa: E402

ACTIONS = ("snapkv-half", "recent-half", "snapkv-90", "recent-90", "knorm:ratio=0.5",
           "adakv-snapkv:ratio=0.5", "pyramidkv:ratio=0.5")
ONLY_GENERAL = {
    "think": lambda: kvpress.ThinKPress(key_channel_compression_ratio=0.5),
    "merging": lambda: kvpress.MergingPress(press=kvpress.KnormPress(compression_ratio=0.5)),
    "simlayerkv": lambda: kvpress.SimLayerKVPress(lazy_threshold=0.5, n_recent=128),
    "compactor": lambda: kvpress.CompactorPress(compression_ratio=0.5),
    "kvcompose": lambda: kvpress.KVComposePress(compression_ratio=0.5),
}


def tiny_model() -> LoadedModel:
    """A random 4-layer Llama (hidden 256, 8 heads, 2 KV heads) with SmolLM2's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=8192, bos_token_id=1, eos_token_id=2,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return LoadedModel(model, load_tokenizer(), "tiny-llama", torch.device("cpu"), torch.float32)


def build_all(loaded: LoadedModel, doc: Document, names: list[str],
              presses: dict[str, object] | None) -> float:
    """Seconds to build every action's pair of ``doc`` (a fresh factory, as a run's first
    document: P's prefill included)."""
    factory = LMPairFactory(loaded, presses=presses)
    started = time.perf_counter()
    factory.prepare(doc, names)
    for name in names:
        factory(doc, name)
    return time.perf_counter() - started


def median_seconds(repeats: int, *args) -> float:
    return statistics.median(build_all(*args) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (default) or smollm2")
    parser.add_argument("--words", type=int, default=700, help="prompt length in words")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    loaded = tiny_model() if args.model == "tiny" else load_model(args.model, "cpu", "float32")
    doc = Document(id="bench", prompt=" ".join(f"fact {i}: item {i % 17} is in box {i % 5}."
                                              for i in range(args.words // 7)))
    n = int(LMPairFactory(loaded).prompt_ids(doc).shape[-1])
    names = list(ACTIONS)
    presses = {name: parse_action(name).make_press(n) for name in names}
    build_all(loaded, doc, names, None)  # warm-up
    shared = median_seconds(args.repeats, loaded, doc, names, None) / len(names)
    general = median_seconds(args.repeats, loaded, doc, names, presses) / len(names)
    print(f"model {loaded.name}, prompt of {n} tokens, {len(names)} actions, median of "
          f"{args.repeats} runs; set-up time per action (prefill and eviction):")
    print(f"  shared prefill (one forward for P and every action): {shared * 1e3:8.1f} ms")
    print(f"  general path (P's forward, then one inside each press): {general * 1e3:8.1f} ms"
          f"   ratio {general / shared:.2f}x")
    print("kvpress classes only the general path measures (set-up with P's prefill, ratio to "
          "the shared prefill's per action):")
    for name, make in ONLY_GENERAL.items():
        seconds = median_seconds(args.repeats, loaded, doc, [name], {name: make()})
        print(f"  {name:<12} {seconds * 1e3:8.1f} ms   ratio {seconds / shared:.2f}x")


if __name__ == "__main__":
    main()
