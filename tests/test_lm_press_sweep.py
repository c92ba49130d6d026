"""Every press family against kvpress's own press, over prompt lengths and ratios (issue 31).

The reference is kvpress's press built as its documentation says, from the user's numbers
alone (``compression_ratio = 1 - ratio``: kvpress removes what kvdrift keeps) and run by
``generate`` inside the press. For every family, length and ratio: the entries each layer and
KV head keeps equal kvpress's, the log-probabilities after the prompt agree within 1e-4 in
float32 and greedy Y is equal. Lengths cross each family's thresholds (1 and 2 tokens, odd and
even, below, at and above SnapKV's window of 64, StreamingLLM's 4 sinks, chunk lengths,
PyramidKV's clamp). Where kvpress refuses a length (an input no longer than its window or sink
count: it asserts), kvdrift's documented fallback runs instead and is checked by
``test_lm_presses.test_short_prompts_run_with_exact_counts``.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import kvpress
import pytest
import torch

from kvdrift.lm.actions.presses import PRESS_SEED
from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.engine.prefill import SharedPrefill, own_prefill_reason, prefill_shared
from tests.test_lm_presses import greedy_generate, greedy_pair, prompt

LOGPROB_TOL = 1e-4
EOS = 2  # the tiny Llama's eos_token_id (SmolLM2's is never greedy within two steps)
RATIOS = (0.3, 0.5, 0.8)  # kvdrift's ratio kept
# 1, 2; odd and even; below, at and above 4 sinks, chunks of 16 and SnapKV's window of 64
LENGTHS_TINY = (1, 2, 5, 16, 17, 64, 65, 66, 131)
# scorers whose kept count is the plain one (their own thresholds: 4 sinks, a window of 64)
PLAIN_SCORER_LENGTHS = (2, 5, 65, 130)
# scorers with a threshold of their own beyond those: LagKV's lag of 128 (two lags: 256),
# NonCausalAttn's chunks of 256
OWN_LENGTHS = {"lagkv": (255, 256, 257), "non_causal_attn": (255, 256, 257)}
OWN_ARITHMETIC = ("snapkv", "recent", "adakv", "criticaladakv", "block", "chunk", "chunkkv",
                  "pyramidkv", "perlayer", "chain")


def removed(ratio: float) -> float:
    """kvpress's compression_ratio for kvdrift's ratio kept: 1 - ratio, in decimal."""
    return float(1 - Fraction(repr(ratio)))


# family -> (kvdrift spec for a ratio kept r, kvpress's press for compression_ratio c)
Build = Callable[[float], Any]
SWEEP: dict[str, tuple[Callable[[float], str], Build]] = {
    "snapkv": (lambda r: f"snapkv:ratio={r}", lambda c: kvpress.SnapKVPress(c)),
    "knorm": (lambda r: f"knorm:ratio={r}", lambda c: kvpress.KnormPress(c)),
    "recent": (lambda r: f"recent:ratio={r}", lambda c: kvpress.StreamingLLMPress(c)),
    "tova": (lambda r: f"tova:ratio={r}", lambda c: kvpress.TOVAPress(c)),
    "expected_attention": (lambda r: f"expected_attention:ratio={r}",
                           lambda c: kvpress.ExpectedAttentionPress(c)),
    "observed_attention": (lambda r: f"observed_attention:ratio={r}",
                           lambda c: kvpress.ObservedAttentionPress(c)),
    "random": (lambda r: f"random:ratio={r},seed=0", lambda c: kvpress.RandomPress(c, seed=0)),
    "keydiff": (lambda r: f"keydiff:ratio={r}", lambda c: kvpress.KeyDiffPress(c)),
    "lagkv": (lambda r: f"lagkv:ratio={r}", lambda c: kvpress.LagKVPress(c)),
    "cur": (lambda r: f"cur:ratio={r}", lambda c: kvpress.CURPress(c)),
    "leverage": (lambda r: f"leverage:ratio={r}", lambda c: kvpress.LeverageScorePress(c)),
    "non_causal_attn": (lambda r: f"non_causal_attn:ratio={r}",
                        lambda c: kvpress.NonCausalAttnPress(c)),
    "cap": (lambda r: f"cap:ratio={r}", lambda c: kvpress.CapPress(c)),
    "adakv": (lambda r: f"adakv-snapkv:ratio={r}",
              lambda c: kvpress.AdaKVPress(press=kvpress.SnapKVPress(c))),
    "criticaladakv": (lambda r: f"criticaladakv-snapkv:ratio={r}",
                      lambda c: kvpress.CriticalAdaKVPress(press=kvpress.SnapKVPress(c))),
    "criticalkv": (lambda r: f"criticalkv-knorm:ratio={r}",
                   lambda c: kvpress.CriticalKVPress(press=kvpress.KnormPress(c))),
    "block": (lambda r: f"block-knorm:ratio={r},block_size=8",
              lambda c: kvpress.BlockPress(press=kvpress.KnormPress(c), block_size=8)),
    "rerotate": (lambda r: f"rerotate-knorm:ratio={r}",
                 lambda c: kvpress.KeyRerotationPress(press=kvpress.KnormPress(c))),
    "chunk": (lambda r: f"chunk-knorm:ratio={r},chunk_length=16",
              lambda c: kvpress.ChunkPress(press=kvpress.KnormPress(c), chunk_length=16)),
    "chunkkv": (lambda r: f"chunkkv-knorm:ratio={r},chunk_length=16",
                lambda c: kvpress.ChunkKVPress(press=kvpress.KnormPress(c), chunk_length=16)),
    "pyramidkv": (lambda r: f"pyramidkv:ratio={r}", lambda c: kvpress.PyramidKVPress(c)),
    "perlayer": (lambda r: f"perlayer-knorm:ratios={r}/0.9",
                 lambda c: kvpress.PerLayerCompressionPress(
                     press=kvpress.KnormPress(), compression_ratios=[c, removed(0.9)])),
    "chain": (lambda r: f"snapkv:ratio=0.8+knorm:ratio={r}",
              lambda c: kvpress.ComposedPress([kvpress.SnapKVPress(removed(0.8)),
                                               kvpress.KnormPress(c)])),
}


def kvpress_run(model, ids: torch.Tensor, press, steps: int, eager: bool
                ) -> tuple[list[int], torch.Tensor, list[list[int]]] | None:
    """Greedy Y, log-probabilities and kept entries per layer and KV head under kvpress's own
    press (None where kvpress refuses the input)."""
    torch.manual_seed(PRESS_SEED)  # kvdrift draws a press's random numbers from it
    try:
        tokens, lps, cache = greedy_generate(model, ids, press, steps, eager, with_cache=True)
    except (AssertionError, RuntimeError, IndexError, ValueError):
        return None
    counts = []
    for i, layer in enumerate(model.model.layers):
        stored = cache.layers[i].keys.shape[2] - (steps - 1)
        heads = [stored] * cache.layers[i].keys.shape[1]
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        if masked is not None:  # head-adaptive: kvpress hides entries with fake keys
            for h in masked[1].tolist():
                heads[h] -= 1
        counts.append(heads)
    return tokens, lps, counts


def compare(model, ids: torch.Tensor, spec: str, press, steps: int, counts: bool = True,
            shared: SharedPrefill | None = None) -> bool:
    """Check kvdrift's Q against kvpress's press on ``ids``; False where kvpress refuses.
    ``shared``: P's and Q's caches from one prefill of several actions, as the runner makes
    them (``lm/factory.py``); by default the pair prefills its own."""
    action = parse_action(spec)
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    want = kvpress_run(model, ids, press, steps, action.needs_attention_weights)
    if want is None:
        return False
    if shared is None:
        pair = LMKernelPair(model, ids, action)
    else:
        pair = LMKernelPair(model, ids, action, reference=shared.reference,
                            compressed=shared.compressed[action.name])
    tokens, lps = greedy_pair(pair, steps)
    where = f"{spec} at n={ids.shape[1]}"
    if EOS in tokens[:-1]:  # generate's min_new_tokens forbids EOS: compare up to it
        stop = tokens.index(EOS)
        tokens, lps, want = tokens[:stop], lps[:stop + 1], (want[0][:stop], want[1][:stop + 1],
                                                            want[2])
    elif tokens[-1] == EOS:
        tokens, want = tokens[:-1], (want[0][:-1], *want[1:])
    if counts:  # (decoding presses compress generated entries too: Y and logits only)
        assert pair.prompt_cache("q").counts.tolist() == want[2], where
    gap = float((lps - want[1]).abs().max())
    assert gap < LOGPROB_TOL, (where, gap)
    assert tokens == want[0], where
    return True


def sweep(model, family: str, lengths, ratios, steps: int, make_ids) -> int:
    """Compare ``family`` at every length and ratio; the number of comparisons made. kvdrift's
    caches of a length's ratios come from one prefill (``prefill_shared``, the runner's way);
    kvpress runs its own press once per ratio."""
    to_spec, to_press = SWEEP[family]
    done = 0
    for n in lengths:
        ids = make_ids(n)
        actions = [parse_action(to_spec(r)) for r in ratios]
        shared = (prefill_shared(model, ids, actions)
                  if all(own_prefill_reason(a) is None for a in actions) else None)
        for r in ratios:
            done += compare(model, ids, to_spec(r), to_press(removed(r)), steps, shared=shared)
    return done


@pytest.mark.parametrize("family", sorted(SWEEP))
def test_family_equals_kvpress_over_lengths(tiny_llama, family):
    lengths = LENGTHS_TINY if family in OWN_ARITHMETIC else PLAIN_SCORER_LENGTHS
    lengths += OWN_LENGTHS.get(family, ())
    done = sweep(tiny_llama, family, lengths, RATIOS, 2, lambda n: prompt(n, seed=n))
    assert done >= 2 * len(RATIOS)  # kvpress refuses only the shortest lengths


DECODING_SWEEP = {
    "decoding": (lambda t: f"decoding-knorm:interval=3,target={t}",
                 lambda t: kvpress.DecodingPress(base_press=kvpress.KnormPress(),
                                                 compression_interval=3, target_size=t)),
    "prefill+decoding": (lambda t: f"snapkv:ratio=0.5+decoding-knorm:interval=2,target={t}",
                         lambda t: kvpress.PrefillDecodingPress(
                             prefilling_press=kvpress.SnapKVPress(removed(0.5)),
                             decoding_press=kvpress.DecodingPress(
                                 base_press=kvpress.KnormPress(), compression_interval=2,
                                 target_size=t))),
}


@pytest.mark.parametrize("family", sorted(DECODING_SWEEP))
def test_decoding_equals_kvpress_over_lengths(tiny_llama, family):
    to_spec, to_press = DECODING_SWEEP[family]
    done = 0
    for n in (3, 17, 65, 130):
        for target in (1, n // 2 + 1):
            done += compare(tiny_llama, prompt(n, seed=n), to_spec(target), to_press(target), 7,
                            counts=False)
    assert done >= 4


# --- SmolLM2 -------------------------------------------------------------------------------

LENGTHS_SMOLLM2 = (301, 590, 935, 2135)
# Families whose kept counts have arithmetic of their own (about 75 s each on 2 CPU cores);
# knorm, criticalkv, block and rerotate keep snapkv's counts and are swept on the tiny model.
SMOLLM2_FAMILIES = ("snapkv", "recent", "adakv", "chunk", "chunkkv", "pyramidkv", "chain")


@pytest.fixture(scope="module")
def smollm2_long(embedded_smollm2):
    from kvdrift.lm.loading.model import encode_prompt, load_tokenizer

    text = " ".join(f"Section {i}: rivers carve valleys over millennia; glaciers widen them, "
                    f"and the sea floods their mouths when the ice melts." for i in range(120))
    ids = encode_prompt(load_tokenizer("smollm2"), text + " Explain how a fjord forms.")
    assert ids.shape[1] >= max(LENGTHS_SMOLLM2)
    return embedded_smollm2.model, ids


@pytest.mark.slow
@pytest.mark.parametrize("family", SMOLLM2_FAMILIES)
def test_family_equals_kvpress_on_smollm2(smollm2_long, family):
    model, ids = smollm2_long
    done = sweep(model, family, LENGTHS_SMOLLM2, RATIOS, 2, lambda n: ids[:, -n:])
    assert done == len(LENGTHS_SMOLLM2) * len(RATIOS)


# --- the run says which press an action is, and what it kept per layer ------------------------


def test_run_keeps_kvpress_pyramid_and_records_it_per_layer(tiny_model_dir, tmp_path):
    import json
    from types import SimpleNamespace

    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from kvdrift.cli import app
    from kvdrift.data import Document, write_jsonl
    from kvdrift.lm.loading.model import encode_prompt, load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    text = next(t for t in ("Rivers carve valleys. " * k for k in range(40, 80))
                if encode_prompt(tokenizer, t, chat_template=False).shape[1] % 2 == 1)
    n = encode_prompt(tokenizer, text, chat_template=False).shape[1]
    assert n % 2 == 1 and n > 128  # the pyramid fits above 2 x window_size at ratio 0.5
    docs, out = tmp_path / "docs.jsonl", tmp_path / "run"
    write_jsonl([Document(id="odd", prompt=text)], docs)
    result = CliRunner().invoke(app, [
        "run", "--model", str(tiny_model_dir), "--docs", str(docs), "--no-chat-template",
        "--actions", "pyramidkv:ratio=0.5", "--replicates", "1", "--horizon", "2",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    press = kvpress.PyramidKVPress(compression_ratio=0.5)  # kvpress's own, as documented
    config = SimpleNamespace(num_hidden_layers=2)
    want = [press.get_layer_budget(SimpleNamespace(layer_idx=i, config=config), n)
            for i in range(2)]
    assert want[0] > want[1]  # a pyramid, not SnapKV's floor(n / 2) in every layer
    kept = pq.read_table(out / "replicates").column("kept_per_layer").to_pylist()
    assert kept == [want]
    meta = json.loads((out / "run.json").read_text())
    assert meta["presses"]["pyramidkv:ratio=0.5"]["kvpress"] == \
        "PyramidKVPress(compression_ratio=0.5)"
