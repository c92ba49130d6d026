"""Every offered kvpress press through the same checks, on the tiny model and on SmolLM2.

For each action: the prompt entries kept per layer and KV head are what the action promises
(computed here by hand from its rule, independently of kvdrift's own check); greedy Y equals
``generate`` run inside the same kvpress press token for token, with log-probabilities equal up
to float32 noise (head-adaptive presses: kvpress's fake keys, kvdrift's exact mask); a budget
that keeps every entry is a no-op whose Q is bit-identical to P (TV exactly 0).
Decode-time eviction: Y equals ``generate`` under ``DecodingPress``; Q along a forced history
compresses at the same generated positions as along its own; delta_t is exactly 0 before the
first compression and positive right after it.
"""

from __future__ import annotations

import contextlib
import functools
import math
from fractions import Fraction
from types import SimpleNamespace

import kvpress
import pytest
import torch

from kvdrift.lm.actions.presses import PRESS_SEED, SCORERS
from kvdrift.lm.actions.spec import Action, parse_action
from kvdrift.lm.engine.decoding import NEVER
from kvdrift.lm.engine.pair import LMKernelPair

N_TINY = 90
STEPS = 16
LOGPROB_TOL = 1e-4  # float32 noise: observed <= 1.2e-5 over these tables


def prompt(n: int, seed: int = 0, vocab: int = 128) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, n), generator=gen)


def floor_kept(ratio: float, n: int) -> int:
    return max(1, math.floor(Fraction(repr(ratio)) * n))


def pyramid_budgets(n: int, ratio_kept: float, layers: int, window: int = 64) -> list[int]:
    """kvpress's own PyramidKV layer budgets for ``compression_ratio = 1 - ratio_kept`` (the
    window clamped to ``n - 1`` below it, kvdrift's documented fallback for short prompts;
    a one-entry prompt is left whole)."""
    if n == 1:
        return [1] * layers
    press = kvpress.PyramidKVPress(compression_ratio=float(1 - Fraction(repr(ratio_kept))),
                                   window_size=min(window, n - 1))
    config = SimpleNamespace(num_hidden_layers=layers)
    return [press.get_layer_budget(SimpleNamespace(layer_idx=i, config=config), n)
            for i in range(layers)]


def expected_counts(spec: str, n: int, layers: int, kv: int) -> list[list[int]] | str:
    """Entries each KV head keeps, by the action's rule; a string for rules that only fix a
    total or a shape (checked separately)."""
    if "+" in spec:  # snapkv:ratio=0.8+knorm:ratio=0.5
        first, second = spec.split("+")
        m = floor_kept(float(first.split("=")[1]), n)
        return [[floor_kept(float(second.split("=")[1]), m)] * kv] * layers
    head, _, tail = spec.partition(":")
    fields = dict(item.split("=") for item in tail.split(","))
    if head.startswith(("adakv-", "criticaladakv-")):
        return "head-adaptive"
    if head.startswith("chunkkv-"):
        return "chunks"
    if head == "pyramidkv":
        return [[b] * kv for b in pyramid_budgets(n, float(fields["ratio"]), layers)]
    if head.startswith("perlayer-"):
        ratios = [float(r) for r in fields["ratios"].split("/")]
        return [[floor_kept(r, n)] * kv for r in ratios]
    if head.startswith("chunk-"):
        size, r = int(fields["chunk_length"]), float(fields["ratio"])
        kept = sum(max(1, math.floor(Fraction(repr(r)) * min(size, n - i)))
                   for i in range(0, n, size))
        return [[kept] * kv] * layers
    if "budget" in fields:
        return [[min(int(fields["budget"]), n)] * kv] * layers
    return [[floor_kept(float(fields["ratio"]), n)] * kv] * layers


def check_counts(spec: str, counts: torch.Tensor, n: int) -> None:
    layers, kv = counts.shape
    want = expected_counts(spec, n, layers, kv)
    fields = dict(item.split("=", 1) for item in spec.partition(":")[2].split(","))
    if want == "head-adaptive":
        per_head = floor_kept(float(fields["ratio"]), n)
        alpha = float(fields.get("alpha_safeguard", 0.2))
        assert counts.sum(1).tolist() == [kv * per_head] * layers, counts.tolist()
        assert int(counts.min()) >= max(1, int(per_head * alpha)), counts.tolist()
        assert int(counts.max()) <= n
    elif want == "chunks":
        size = int(fields["chunk_length"])
        if n < size:  # no whole chunk: kvpress runs the scorer alone
            assert counts.tolist() == [[floor_kept(float(fields["ratio"]), n)] * kv] * layers
            return
        n_chunks = -(-n // size)
        k = floor_kept(float(fields["ratio"]), n_chunks)
        last = n - (n_chunks - 1) * size
        for row in counts.tolist():
            assert len(set(row)) == 1 and row[0] in (k * size, (k - 1) * size + last), row
    else:
        assert counts.tolist() == want


def greedy_pair(pair: LMKernelPair, steps: int) -> tuple[list[int], torch.Tensor]:
    state = pair.start("q", 1)
    tokens, lps = [], []
    for _ in range(steps):
        lp = pair.logprobs(state)[0]
        tokens.append(int(lp.argmax()))
        lps.append(lp)
        state = pair.advance(state, torch.tensor([tokens[-1]]))
    return tokens, torch.stack(lps)


def greedy_generate(model, ids: torch.Tensor, press, steps: int, eager: bool,
                    with_cache: bool = False):
    """kvpress's documented usage: ``with press(model): model.generate(...)`` (and the cache
    it leaves, ``with_cache``)."""
    current = model.config._attn_implementation
    if eager:
        model.set_attn_implementation("eager")
    ctx = press(model) if press is not None else contextlib.nullcontext()
    try:
        with ctx, torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=steps, min_new_tokens=steps, output_logits=True,
                                 return_dict_in_generate=True)
    finally:
        model.set_attn_implementation(current)
    logits = torch.stack(out.logits)[:, 0].double()
    tokens, lps = out.sequences[0, ids.shape[1]:].tolist(), torch.log_softmax(logits, -1)
    return (tokens, lps, out.past_key_values) if with_cache else (tokens, lps)


def kvpress_generate(model, ids: torch.Tensor, action: Action, steps: int
                     ) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and log-probabilities of ``generate`` inside the action's press, with
    torch's generator seeded as kvdrift seeds it (a press's random numbers: leverage)."""
    torch.manual_seed(PRESS_SEED)
    return greedy_generate(model, ids, action.make_press(ids.shape[1]), steps,
                           action.needs_attention_weights)


def generate_once(runs: dict, model, ids: torch.Tensor, action: Action, steps: int
                  ) -> tuple[list[int], torch.Tensor]:
    """:func:`kvpress_generate`, run once per model, prompt, action and length and kept in
    ``runs`` (the ``kvpress_runs`` session fixture): a run is deterministic, the same press
    on the same seed."""
    key = (id(model), tuple(ids.flatten().tolist()), action.name, steps)
    if key not in runs:
        runs[key] = kvpress_generate(model, ids, action, steps)
    return runs[key]


def check_against_generate(model, ids: torch.Tensor, spec: str, steps: int,
                           generate=kvpress_generate) -> LMKernelPair:
    action = parse_action(spec)
    pair = LMKernelPair(model, ids, action)
    tokens, lps = greedy_pair(pair, steps)
    want, want_lps = generate(model, ids, action, steps)
    assert tokens == want, spec
    assert float((lps - want_lps).abs().max()) < LOGPROB_TOL, spec
    return pair


PLAIN = sorted({f"{short}:ratio=0.5" for short, cls in SCORERS.items() if short != "recent"
                and short != "random"} | {"random:ratio=0.5,seed=0", "snapkv:budget=30",
                                          "recent:ratio=0.4"})
FAMILIES_TINY = [
    "adakv-snapkv:ratio=0.5",
    "adakv-knorm:ratio=0.3,alpha_safeguard=0.5",
    "criticaladakv-snapkv:ratio=0.5",
    "criticalkv-knorm:ratio=0.5",
    "block-knorm:ratio=0.5,block_size=8",
    "rerotate-knorm:ratio=0.5",
    "chunk-knorm:ratio=0.5,chunk_length=16",
    "chunkkv-snapkv:ratio=0.5,chunk_length=8",
    "pyramidkv:ratio=0.5",
    "perlayer-knorm:ratios=0.9/0.3",
    "snapkv:ratio=0.8+knorm:ratio=0.5",
]
DECODING = [
    "decoding-knorm:interval=4,target=80",  # 4 compressions in 16 steps
    "decoding-knorm:interval=3,target=60,buffer=0",
    "decoding-knorm:interval=5,target=1",  # target <= 1: every step
    "snapkv:ratio=0.5+decoding-knorm:interval=5,target=40",
    "decoding-snapkv:interval=10,target=80,window_size=4,buffer=16",
    "decoding-snapkv:interval=4,target=60,window_size=2,buffer=8",  # pools over cache order
    "decoding-recent:interval=3,target=70",  # keeps the first entries of kvpress's cache order
    "decoding-tova:interval=6,target=70",
]


@pytest.mark.parametrize("spec", PLAIN + FAMILIES_TINY)
def test_prefill_presses_on_tiny_model(tiny_llama, spec):
    ids = prompt(N_TINY)
    pair = check_against_generate(tiny_llama, ids, spec, STEPS)
    check_counts(spec, pair.prompt_cache("q").counts, N_TINY)


@pytest.mark.parametrize("spec", DECODING)
def test_decoding_presses_equal_generate(tiny_llama, spec):
    check_against_generate(tiny_llama, prompt(N_TINY), spec, STEPS)


@pytest.mark.parametrize("spec", ["knorm:ratio=1.0", "adakv-snapkv:ratio=1.0",
                                  "pyramidkv:budget=90", "perlayer-knorm:ratios=1.0/1.0",
                                  "chunk-knorm:ratio=1.0",
                                  "chunkkv-snapkv:ratio=1.0", "criticalkv-knorm:budget=500",
                                  "snapkv:budget=200+knorm:ratio=1.0"])
def test_budget_keeping_everything_is_a_noop(tiny_llama, spec):
    pair = LMKernelPair(tiny_llama, prompt(N_TINY), spec)
    assert pair.q_is_p and pair.prompt_cache("q") is pair.prompt_cache("p")
    assert parse_action(spec).make_press(N_TINY) is None


def tv_along(pair: LMKernelPair, tokens: list[int]) -> list[float]:
    """delta_t = TV(P(. | x_<t), Q(. | x_<t)) along one history, t = 1..len(tokens)."""
    p, q, out = pair.start("p", 1), pair.start("q", 1), []
    for tok in tokens:
        out.append(0.5 * float((pair.logprobs(p).exp() - pair.logprobs(q).exp()).abs().sum()))
        p, q = pair.advance(p, torch.tensor([tok])), pair.advance(q, torch.tensor([tok]))
    return out


def test_full_and_unreached_decoding_target_give_tv_exactly_zero(tiny_llama):
    history = prompt(12, seed=5)[0].tolist()
    for spec in ("full", "decoding-knorm:interval=2,target=500"):
        assert tv_along(LMKernelPair(tiny_llama, prompt(N_TINY), spec), history) == [0.0] * 12


def test_delta_changes_right_after_a_compression(tiny_llama):
    # decode-only eviction: Q is P until the first compression, after step `interval`
    interval = 5
    pair = LMKernelPair(tiny_llama, prompt(N_TINY), f"decoding-knorm:interval={interval},"
                                                    f"target=40")
    delta = tv_along(pair, prompt(3 * interval, seed=7)[0].tolist())
    # delta_t uses the cache after step t - 1: compressed from t = interval + 2 on
    assert delta[:interval + 1] == [0.0] * (interval + 1)
    assert all(d > 1e-3 for d in delta[interval + 1:]), delta


def test_forced_path_compresses_at_the_same_generated_positions(tiny_llama):
    spec = "decoding-knorm:interval=3,target=50"
    pair = LMKernelPair(tiny_llama, prompt(N_TINY), spec)
    xs = prompt(10, seed=11)[0]
    others = prompt(10, seed=12)[0]
    alone = pair.start("q", 1)
    batch = pair.start("q", 2)  # row 0 along X, row 1 along another history
    for t in range(10):
        alone = pair.advance(alone, xs[t:t + 1])
        batch = pair.advance(batch, torch.stack([xs[t], others[t]]))
        assert torch.allclose(pair.logprobs(alone)[0], pair.logprobs(batch)[0], atol=1e-5)
        for layer in range(2):
            steps = {int(s) for s in batch.evictions.own[layer][0].unique() if s != NEVER}
            steps |= {int(s) for s in batch.evictions.prompt[layer][0].unique() if s != NEVER}
            assert steps == {s for s in (3, 6, 9) if s <= t + 1}
            live = (batch.evictions.prompt[layer][0] > t + 1).sum(-1) + \
                (batch.evictions.own[layer][0] > t + 1).sum(-1)
            last = (t + 1) // 3 * 3  # last compression: 50 kept, then one slot per step
            assert live.tolist() == [N_TINY + t + 1 if last == 0 else 50 + t + 1 - last] * 2


def test_truncate_replays_the_rows_own_compressions(tiny_llama):
    pair = LMKernelPair(tiny_llama, prompt(N_TINY), "decoding-knorm:interval=3,target=50")
    xs = prompt(9, seed=3)[0]
    state, logprobs = pair.start("q", 1), []
    for t in range(9):
        logprobs.append(pair.logprobs(state)[0])
        state = pair.advance(state, xs[t:t + 1])
    final = pair.logprobs(state)
    for keep in (7, 6, 4, 2):
        cut = pair.truncate(pair.select(state, torch.tensor([0])), torch.tensor([keep]))
        assert torch.allclose(pair.logprobs(cut)[0], logprobs[keep], atol=1e-5), keep
        again = cut
        for t in range(keep, 9):  # the same tokens again: the same compressions
            again = pair.advance(again, xs[t:t + 1])
        assert torch.allclose(pair.logprobs(again), final, atol=1e-5), keep


def test_decoding_window_larger_than_snapkv_window_is_required(tiny_llama):
    with pytest.raises(ValueError, match="window_size=64"):
        LMKernelPair(tiny_llama, prompt(N_TINY), "decoding-snapkv:interval=32,target=40")


# --- SmolLM2 -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(embedded_smollm2):
    return embedded_smollm2.model


@pytest.fixture(scope="module")
def smollm2_ids(smollm2):
    from kvdrift.lm.loading.model import encode_prompt, load_tokenizer

    text = ("Rivers carve valleys over millennia; glaciers widen them, and the sea floods "
            "their mouths when the ice melts. ") * 6 + "Explain how a fjord forms."
    return encode_prompt(load_tokenizer("smollm2"), text)


SMOLLM2 = PLAIN + [
    "knorm:budget=64",
    "adakv-snapkv:ratio=0.5", "criticaladakv-snapkv:ratio=0.5", "criticalkv-snapkv:ratio=0.5",
    "block-knorm:ratio=0.5,block_size=16", "rerotate-snapkv:ratio=0.5",
    "chunk-knorm:ratio=0.5,chunk_length=32", "chunkkv-snapkv:ratio=0.5,chunk_length=16",
    "pyramidkv:ratio=0.5", "perlayer-knorm:ratios=" + "/".join(["0.9", "0.5", "0.3"] * 10),
    "snapkv:ratio=0.8+knorm:ratio=0.5",
    # exact key-norm ties (a repeated token in layer 0: RoPE keeps norms) go by cache order
    "decoding-knorm:interval=2,target=100",
    "snapkv:ratio=0.6+decoding-recent:interval=3,target=80",
]


@pytest.mark.slow
@pytest.mark.parametrize("spec", SMOLLM2)
def test_presses_on_smollm2(smollm2, smollm2_ids, kvpress_runs, spec):
    pair = check_against_generate(smollm2, smollm2_ids, spec, 8,
                                  functools.partial(generate_once, kvpress_runs))
    if "decoding-" not in spec:
        check_counts(spec, pair.prompt_cache("q").counts, smollm2_ids.shape[1])


SHORT_DECODING = ["decoding-recent:interval=2,target=3", "decoding-expected_attention:interval=2,"
                  "target=2", "decoding-knorm:interval=1,target=1"]


@pytest.mark.parametrize("spec", PLAIN + FAMILIES_TINY + SHORT_DECODING)
def test_short_prompts_run_with_exact_counts(tiny_llama, spec):
    # kvpress asserts on inputs shorter than window_size / n_sink: kvdrift clamps them
    for n in (1, 2, 5):
        pair = LMKernelPair(tiny_llama, prompt(n, seed=n), spec)
        tokens, lps = greedy_pair(pair, 4)
        assert torch.isfinite(lps).any(-1).all()
        if "decoding-" not in spec:
            check_counts(spec, pair.prompt_cache("q").counts, n)


def test_join_and_select_keep_each_rows_compressions(tiny_llama):
    # rows at different lengths (one past two compressions, one before any) joined, advanced
    # together, then split again: each equals the row advanced alone
    pair = LMKernelPair(tiny_llama, prompt(N_TINY), "decoding-recent:interval=3,target=60")
    xs = prompt(12, seed=21)[0]
    long, short = pair.start("q", 1), pair.start("q", 1)
    for t in range(7):
        long = pair.advance(long, xs[t:t + 1])
    short = pair.advance(short, xs[:1])
    ref_long = pair.select(long, torch.tensor([0]))
    ref_short = pair.select(short, torch.tensor([0]))
    both = pair.join([long, short])
    for t in range(7, 12):
        both = pair.advance(both, torch.stack([xs[t], xs[t - 6]]))
        ref_long = pair.advance(ref_long, xs[t:t + 1])
        ref_short = pair.advance(ref_short, xs[t - 6:t - 5])
    lps = pair.logprobs(both)
    assert torch.allclose(lps[0], pair.logprobs(ref_long)[0], atol=1e-5)
    assert torch.allclose(lps[1], pair.logprobs(ref_short)[0], atol=1e-5)
    back = pair.select(both, torch.tensor([1]))
    assert torch.allclose(pair.logprobs(back)[0], lps[1], atol=1e-5)


def test_random_presses_are_reproducible_and_leave_callers_randomness(tiny_llama):
    # LeverageScorePress sketches keys with torch.randn: kvdrift fixes its seed, so two prefills
    # keep the same entries whatever the caller's random state, which it leaves as it was
    from kvdrift.lm.engine.prefill import prefill

    ids = prompt(N_TINY)
    action = parse_action("leverage:ratio=0.5")
    torch.manual_seed(123)
    first = prefill(tiny_llama, ids, action)
    after = torch.rand(4)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(4), after)  # the prefill drew nothing from the caller's stream
    torch.manual_seed(999)
    second = prefill(tiny_llama, ids, action)
    for k1, k2 in zip(first.keys, second.keys, strict=True):
        assert torch.equal(k1, k2)
