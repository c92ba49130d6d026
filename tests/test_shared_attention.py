"""Shared-prompt attention against the per-row-copy computation it replaces.

The reference is transformers' own SDPA attention over a ``DynamicCache`` in which every row
holds a full copy of its side's prompt entries followed by its generated entries, with a 2D
attention mask for holes: the layout kvdrift used before the prompt was shared. Both read the
same cached keys/values, so they must agree to float32 noise (1e-4 on logits of size ~10) for
every row, whatever its length and holes, on GQA, multi-head, Qwen2- and Mistral-style models.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import DynamicCache

from kvdrift.lm.engine.pair import LMKernelPair

TOL = 1e-4
MODEL_KINDS = [
    ("llama", 4, 2),  # GQA, 2 query heads per KV head
    ("llama", 6, 2),  # GQA, 3 per KV head
    ("llama", 4, 4),  # multi-head
    ("llama", 4, 1),  # multi-query
    ("qwen2", 4, 2),  # attention biases
    ("mistral", 4, 2),
]


def _config(kind: str, heads: int, kv_heads: int, **extra):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[kind]
    fields = dict(vocab_size=128, hidden_size=16 * heads, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  max_position_embeddings=1024, initializer_range=0.2, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="sdpa")
    if kind == "mistral":
        fields["sliding_window"] = None
    return cls(**(fields | extra))


def _model(kind: str = "llama", heads: int = 4, kv_heads: int = 2, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(_config(kind, heads, kv_heads)).to(dtype).eval()


def _prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def _tokens(rows: int, steps: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 128, (rows, steps), generator=torch.Generator().manual_seed(seed))


def per_row_copy_logits(pair: LMKernelPair, state, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token logits after appending ``tokens`` ``[n]``, with the prompt copied per row."""
    n = state.n
    cache = DynamicCache()
    for i, layer in enumerate(state.cache.layers):
        keys = torch.cat([layer.prompt_keys.expand(n, -1, -1, -1), layer.keys], dim=2)
        values = torch.cat([layer.prompt_values.expand(n, -1, -1, -1), layer.values], dim=2)
        cache.update(keys.clone(), values.clone(), i)
    kept = state.cache.layers[0].prompt_keys.shape[2]
    mask = torch.cat([torch.ones(n, kept, dtype=torch.long), state.mask,
                      torch.ones(n, 1, dtype=torch.long)], dim=1)  # [n, kept + G + 1]
    with torch.no_grad():
        out = pair.model(input_ids=tokens[:, None], attention_mask=mask,
                         position_ids=(pair.n_prompt + state.lengths)[:, None],
                         past_key_values=cache, use_cache=True)
    return out.logits[:, -1].float()


def advanced_logits(pair: LMKernelPair, state, tokens: torch.Tensor) -> torch.Tensor:
    return pair.advance(state, tokens).logits


def walk(pair: LMKernelPair, side: str, tokens: torch.Tensor):
    state = pair.start(side, tokens.shape[0])
    for t in range(tokens.shape[1]):
        state = pair.advance(state, tokens[:, t])
    return state


@pytest.mark.parametrize("kind,heads,kv_heads", MODEL_KINDS)
@pytest.mark.parametrize("action", ["full", "snapkv-half", "recent-half"])
def test_shared_prompt_equals_per_row_copies(kind, heads, kv_heads, action):
    model = _model(kind, heads, kv_heads)
    pair = LMKernelPair(model, _prompt(90), action)
    side = "p" if action == "full" else "q"
    history = _tokens(5, 7, seed=1)
    state = walk(pair, side, history)
    # rows at different lengths, with holes left by truncate (its re-fed slots included)
    state = pair.truncate(state, torch.tensor([7, 0, 3, 6, 1]))
    state = pair.advance(state, _tokens(5, 1, seed=2)[:, 0])
    assert state.lengths.tolist() == [8, 1, 4, 7, 2]
    assert not bool(state.mask.all())  # there are holes
    nxt = _tokens(5, 1, seed=3)[:, 0]
    expected = per_row_copy_logits(pair, state, nxt)
    got = advanced_logits(pair, state, nxt)
    assert torch.allclose(got, expected, atol=TOL, rtol=0), (got - expected).abs().max()


def test_joined_and_selected_rows_keep_their_logits(tiny_llama):
    pair = LMKernelPair(tiny_llama, _prompt(60), "snapkv-half")
    a = walk(pair, "q", _tokens(3, 5, seed=4))
    b = pair.truncate(walk(pair, "q", _tokens(2, 9, seed=5)), torch.tensor([9, 4]))
    joined = pair.join([pair.select(a, torch.tensor([2, 0])), b])
    assert joined.lengths.tolist() == [5, 5, 9, 4]
    expected = torch.cat([pair.select(a, torch.tensor([2, 0])).logits, b.logits])
    assert torch.equal(joined.logits, expected)
    nxt = _tokens(4, 1, seed=6)[:, 0]
    assert torch.allclose(advanced_logits(pair, joined, nxt),
                          per_row_copy_logits(pair, joined, nxt), atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="one side"):
        pair.join([a, pair.start("p", 1)])


def test_forks_share_the_prompt_and_copy_only_generated_entries(tiny_llama):
    pair = LMKernelPair(tiny_llama, _prompt(60), "snapkv-half")
    prompt_keys = pair.prompt_cache("q").keys[0]
    state = walk(pair, "q", _tokens(4, 3, seed=7))
    forks = [state, pair.select(state, torch.tensor([1, 3])),
             pair.truncate(pair.select(state, torch.tensor([0])), torch.tensor([1])),
             pair.join([pair.start("q", 2), pair.select(state, torch.tensor([2]))])]
    for fork in forks:
        layer = fork.cache.layers[0]
        assert layer.prompt_keys.data_ptr() == prompt_keys.data_ptr()
        assert layer.keys.shape[0] == fork.n and layer.keys.shape[2] == fork.mask.shape[1]


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 0.15), (torch.float16, 0.02)])
def test_half_precision_runs_and_matches_per_row_copies(dtype, tol):
    model = _model(dtype=dtype)
    pair = LMKernelPair(model, _prompt(50), "snapkv-half")
    state = pair.truncate(walk(pair, "q", _tokens(3, 4, seed=8)), torch.tensor([4, 2, 0]))
    nxt = _tokens(3, 1, seed=9)[:, 0]
    got = advanced_logits(pair, state, nxt)
    assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
    expected = per_row_copy_logits(pair, state, nxt)
    assert (got - expected).abs().max() < tol


def test_greedy_paths_equal_generate_past_buffer_regrowth(tiny_llama):
    """H = 110 crosses the generated buffers' regrowth (32 spare slots, then more) on both
    sides, on a prompt of several hundred tokens, with and without the press."""
    ids = _prompt(300, seed=10)
    steps = 110
    pair = LMKernelPair(tiny_llama, ids, "snapkv-half")
    for side, press in (("p", None), ("q", pair.action.make_press(ids.shape[1]))):
        state = pair.start(side, 1)
        tokens = []
        capacities = set()
        for _ in range(steps):
            logprobs = pair.logprobs(state)
            logprobs[:, pair.eos_token_id] = float("-inf")  # as min_new_tokens does
            token = logprobs.argmax(-1)
            tokens.append(int(token))
            state = pair.advance(state, token)
            capacities.add(state.cache.layers[0].capacity)
        assert len(capacities) >= 2  # the buffers were regrown at least once
        ctx = press(tiny_llama) if press is not None else contextlib.nullcontext()
        with ctx, torch.no_grad():
            out = tiny_llama.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=steps, min_new_tokens=steps)
        assert tokens == out[0, ids.shape[1]:].tolist(), side


def test_prompt_beyond_the_context_window_is_refused(tiny_llama):
    window = tiny_llama.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"context window allows \\({window} positions"):
        LMKernelPair(tiny_llama, _prompt(window), "full")


def test_the_attention_refuses_to_run_without_its_cache(tiny_llama):
    from kvdrift.lm.engine.shared_attention import ATTENTION_NAME, attention_implementation

    ids = _prompt(8)
    with attention_implementation(tiny_llama, ATTENTION_NAME), torch.no_grad():
        with pytest.raises(RuntimeError, match="kvdrift_cache"):
            tiny_llama(input_ids=ids)
    assert tiny_llama.config._attn_implementation == "sdpa"  # restored after the error


def test_truncate_defers_its_forward_until_logits_are_asked_for(tiny_llama):
    pair = LMKernelPair(tiny_llama, _prompt(40), "snapkv-half")
    tokens = _tokens(3, 6, seed=11)
    state = walk(pair, "q", tokens)
    calls = []
    hook = tiny_llama.register_forward_hook(lambda *args: calls.append(1))
    try:
        short = pair.truncate(state, torch.tensor([6, 2, 0]))
        assert calls == []  # no forward pass
        assert short.stale.tolist() == [False, True, False]
        lp = pair.logprobs(short)
        assert len(calls) == 1  # one re-feed, of the stale row only
        advanced = pair.advance(short, tokens[:, 0])
        assert not bool(advanced.stale.any())
    finally:
        hook.remove()
    for i, n in enumerate([6, 2, 0]):
        fresh = pair.logprobs(walk(pair, "q", tokens[i:i + 1, :n]))
        assert torch.allclose(lp[i], fresh[0], atol=TOL, rtol=0), i
    again = walk(pair, "q", torch.cat([tokens[:, :2], tokens[:, :1]], dim=1)[1:2])
    assert torch.allclose(pair.logprobs(advanced)[1], pair.logprobs(again)[0], atol=TOL, rtol=0)


@pytest.fixture(params=["fused", "matmul"])
def prompt_path(request, monkeypatch):
    """Both prompt-attention paths: PyTorch's fused CPU kernel and the matrix-product one
    (what other devices run)."""
    from kvdrift.lm.engine import shared_attention

    if request.param == "matmul":
        monkeypatch.setattr(shared_attention, "_FLASH_CPU", None)
    elif shared_attention._FLASH_CPU is None:
        pytest.skip("this PyTorch has no fused CPU attention kernel")
    return request.param


def test_prompt_part_and_merge_equal_one_softmax_over_all_entries(prompt_path):
    from kvdrift.lm.engine.shared_attention import _merge, _prompt_attention

    g = torch.Generator().manual_seed(10)
    kv, rows, n_prompt, n_own, dim = 3, 5, 40, 6, 8
    q = torch.randn(kv, rows, dim, generator=g)
    keys, values = torch.randn(kv, n_prompt, dim, generator=g), torch.randn(kv, n_prompt, dim,
                                                                             generator=g)
    own_keys, own_values = torch.randn(kv, rows, n_own, dim, generator=g), torch.randn(
        kv, rows, n_own, dim, generator=g)
    hidden = torch.rand(kv, rows, n_prompt, generator=g) < 0.4
    hidden[1, 2] = True  # a row of one head that sees no prompt entry
    own_hidden = torch.rand(kv, rows, n_own, generator=g) < 0.4
    own_hidden[..., -1] = False  # a row always sees its own new slot

    scores = torch.cat([(q[:, :, None] * keys[:, None]).sum(-1).masked_fill(hidden, -torch.inf),
                        (q[:, :, None] * own_keys).sum(-1).masked_fill(own_hidden, -torch.inf)],
                       dim=-1)
    probs = torch.softmax(scores.double(), dim=-1)
    expected = (probs[..., :n_prompt, None] * values[:, None].double()).sum(-2) + (
        probs[..., n_prompt:, None] * own_values.double()).sum(-2)

    out, lse = _prompt_attention(q, keys, values, hidden)
    assert lse[1, 2] == -torch.inf and torch.equal(out[1, 2], torch.zeros(dim))
    own_scores = (q[:, :, None] * own_keys).sum(-1).masked_fill(own_hidden, -torch.inf)
    own_lse = torch.logsumexp(own_scores, dim=-1)
    own_out = (torch.softmax(own_scores, -1)[..., None] * own_values).sum(-2)
    got = _merge(out, lse, own_out, own_lse)
    assert (got.double() - expected).abs().max() < 1e-5
    # a mask shared by every row ([kv, 1, P], head-adaptive presses) broadcasts
    shared = hidden[:, :1]
    out_b, lse_b = _prompt_attention(q, keys, values, shared)
    out_r, lse_r = _prompt_attention(q, keys, values, shared.expand(-1, rows, -1))
    assert (out_b - out_r).abs().max() < 1e-6 and (lse_b - lse_r).abs().max() < 1e-6


def test_both_prompt_paths_match_per_row_copies(prompt_path, monkeypatch):
    from kvdrift.lm.engine import shared_attention

    fused_calls = []
    if prompt_path == "fused":  # on CPU the fused kernel is the one that runs
        kernel = shared_attention._FLASH_CPU
        monkeypatch.setattr(shared_attention, "_FLASH_CPU",
                            lambda *a, **k: fused_calls.append(1) or kernel(*a, **k))
    pair = LMKernelPair(_model("llama", 6, 2), _prompt(90), "snapkv-half")
    state = walk(pair, "q", _tokens(4, 6, seed=11))
    state = pair.truncate(state, torch.tensor([6, 0, 2, 5]))
    state = pair.advance(state, _tokens(4, 1, seed=12)[:, 0])
    nxt = _tokens(4, 1, seed=13)[:, 0]
    expected = per_row_copy_logits(pair, state, nxt)
    got = advanced_logits(pair, state, nxt)
    assert torch.allclose(got, expected, atol=TOL, rtol=0), (got - expected).abs().max()
    assert bool(fused_calls) == (prompt_path == "fused")


@pytest.mark.parametrize("action", ["adakv-snapkv:ratio=0.5",  # a prompt mask per KV head
                                    "decoding-knorm:interval=3,target=50"])  # per-row masks
def test_fused_and_matmul_prompt_paths_agree_under_masks(action, monkeypatch):
    from kvdrift.lm.engine import shared_attention

    if shared_attention._FLASH_CPU is None:
        pytest.skip("this PyTorch has no fused CPU attention kernel")
    model = _model("llama", 6, 2)
    tokens = _tokens(4, 8, seed=14)

    def logits_per_step() -> list[torch.Tensor]:
        pair = LMKernelPair(model, _prompt(90), action)
        state, out = pair.start("q", 4), []
        for t in range(tokens.shape[1]):
            state = pair.advance(state, tokens[:, t])
            out.append(state.logits)
            if t == 4:  # holes
                state = pair.truncate(state, torch.tensor([5, 1, 3, 0]))
        return out

    fused = logits_per_step()
    monkeypatch.setattr(shared_attention, "_FLASH_CPU", None)
    for a, b in zip(fused, logits_per_step(), strict=True):
        assert (a - b).abs().max() < TOL


def test_importing_the_attention_first_leaves_it_unwrapped_by_kvpress():
    """kvpress wraps the attention functions registered when it is imported, and its wrapper
    passes ``dropout`` positionally; imported first, kvdrift's function must still be its own
    (this order once broke every decoding step with a TypeError)."""
    import subprocess
    import sys

    code = ("import torch, kvdrift.lm.engine.shared_attention as sa, kvpress\n"
            "from transformers import AttentionInterface\n"
            "assert AttentionInterface._global_mapping[sa.ATTENTION_NAME] is "
            "sa.shared_prompt_attention\n"
            "from transformers import LlamaConfig, AutoModelForCausalLM\n"
            "from kvdrift.lm.engine.pair import LMKernelPair\n"
            "torch.manual_seed(0)\n"
            "m = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=64, hidden_size=32, "
            "intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, "
            "num_key_value_heads=1)).eval()\n"
            "pair = LMKernelPair(m, torch.arange(3, 30), 'snapkv-half')\n"
            "s = pair.advance(pair.start('q', 2), torch.tensor([5, 6]))\n"
            "assert torch.isfinite(s.logits).all()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


def _reference_attention(query, scale, prompt_keys, prompt_values, prompt_hidden, parts):
    """One float64 softmax per row and head over [prompt entries, own generated entries], with
    every mask applied by hand: what ``_attend_groups`` must compute."""
    n, heads, _, dim = query.shape
    kv = prompt_keys.shape[0]
    groups = heads // kv
    out = torch.zeros(n, heads, dim, dtype=torch.float64)
    row = 0
    for keys, values, slots, live in parts:
        for r in range(keys.shape[0]):
            for h in range(heads):
                k = h // groups
                q = query[row, h, 0].double() * scale
                hide_p = prompt_hidden[k].clone()
                see_own = slots[r].clone()
                if live is not None:
                    hide_p |= ~live[0][r, k]
                    see_own &= live[1][r, k]
                s_p = (prompt_keys[k].double() @ q).masked_fill(hide_p, -torch.inf)
                s_o = (keys[r, k].double() @ q).masked_fill(~see_own, -torch.inf)
                w = torch.softmax(torch.cat([s_p, s_o]), dim=0)
                out[row, h] = (w[:s_p.numel(), None] * prompt_values[k].double()).sum(0) + (
                    w[s_p.numel():, None] * values[r, k].double()).sum(0)
            row += 1
    return out.reshape(n, 1, heads, dim)


@pytest.mark.parametrize("with_live", [False, True])
def test_attend_applies_every_mask_like_one_softmax(prompt_path, with_live):
    """``_attend_groups`` over three parts (one prompt group) of different sizes and generated
    lengths, a head-adaptive prompt mask and (``with_live``) decode-time masks on two of the
    parts, against a hand-masked float64 softmax per row and head."""
    from types import SimpleNamespace

    from kvdrift.lm.engine.shared_attention import _attend_groups

    g = torch.Generator().manual_seed(20)
    kv, groups, dim, n_prompt = 2, 3, 8, 12
    prompt_keys = torch.randn(kv, n_prompt, dim, generator=g)
    prompt_values = torch.randn(kv, n_prompt, dim, generator=g)
    prompt_hidden = torch.rand(kv, n_prompt, generator=g) < 0.3
    layer = SimpleNamespace(prompt_keys=prompt_keys[None], prompt_values=prompt_values[None],
                            prompt_live=~prompt_hidden[None])
    parts, sizes = [], [(2, 5), (3, 5), (1, 5)]
    for i, (m, G) in enumerate(sizes):
        keys, values = torch.randn(m, kv, G, dim, generator=g), torch.randn(m, kv, G, dim,
                                                                            generator=g)
        slots = torch.rand(m, G, generator=g) < 0.7
        slots[:, -1] = True  # the new slot
        live = None
        if with_live and i != 1:
            own_live = torch.rand(m, kv, G, generator=g) < 0.8
            own_live[..., -1] = True
            live = (torch.rand(m, kv, n_prompt, generator=g) < 0.7, own_live)
        parts.append((keys, values, slots, live))
    n = sum(m for m, _ in sizes)
    query = torch.randn(n, kv * groups, 1, dim, generator=g)
    got = _attend_groups(query, 0.35, [[(layer, *p) for p in parts]])  # one prompt group
    expected = _reference_attention(query, 0.35, prompt_keys, prompt_values, prompt_hidden,
                                    parts)
    assert got.shape == (n, 1, kv * groups, dim)
    assert (got.double() - expected).abs().max() < 1e-5


def test_a_model_that_refuses_registered_attention_gets_one_clear_error():
    from types import SimpleNamespace

    from kvdrift.lm.engine.shared_attention import ATTENTION_NAME, attention_implementation

    class Refusing:  # keeps its attention whatever it is asked
        def __init__(self):
            self.config = SimpleNamespace(_attn_implementation="sdpa")
            self.calls = 0

        def set_attn_implementation(self, name):
            self.calls += 1

    class Accepting(Refusing):
        def set_attn_implementation(self, name):
            self.calls += 1
            self.config._attn_implementation = name

    with pytest.raises(ValueError, match="Refusing does not take registered attention"):
        with attention_implementation(Refusing(), ATTENTION_NAME):
            pass
    first, second = Accepting(), Accepting()
    for model in (first, second):
        with attention_implementation(model, ATTENTION_NAME):
            assert model.config._attn_implementation == ATTENTION_NAME
        assert model.config._attn_implementation == "sdpa"  # restored
    assert first.calls == 2  # validated once per class: switched there and back
    assert second.calls == 0  # the class is known: no second validation


def test_the_attention_names_what_is_missing_or_wrong(tiny_llama):
    from kvdrift.lm.engine.shared_attention import shared_prompt_attention

    pair = LMKernelPair(tiny_llama, _prompt(20), "snapkv-half")
    state = pair.start("q", 2)
    module = pair._modules[0]
    q = torch.zeros(2, 4, 1, 16)
    kv = torch.zeros(2, 2, 1, 16)
    with pytest.raises(RuntimeError, match="needs kvdrift_cache= and kvdrift_slots= in the "
                                           "model's forward"):
        shared_prompt_attention(module, q, kv, kv, None, kvdrift_cache=state.cache)
    with pytest.raises(ValueError, match="decodes one token per row; got q_len=2"):
        shared_prompt_attention(module, torch.zeros(2, 4, 2, 16), kv, kv, None,
                                kvdrift_cache=state.cache,
                                kvdrift_slots=torch.ones(2, 1, dtype=torch.bool))


def test_a_joint_step_reads_each_sides_prompt_once_per_layer(tiny_llama, monkeypatch):
    """P rows, then Q-along-Y and forced rows: two prompt passes per layer (one per side),
    with the rows of both Q states in one."""
    from kvdrift.lm.engine import shared_attention

    rows_seen = []
    inner = shared_attention._prompt_attention
    monkeypatch.setattr(shared_attention, "_prompt_attention",
                        lambda q, *a: rows_seen.append(q.shape[1]) or inner(q, *a))
    pair = LMKernelPair(tiny_llama, _prompt(40), "snapkv-half")
    states = [pair.start("p", 3), pair.start("q", 3), pair.start("q", 2)]
    pair.advance_many(states, [torch.tensor([5, 6, 7]), torch.tensor([5, 6, 8]),
                               torch.tensor([9, 9])])
    groups = 4 // 2  # query heads per KV head
    assert rows_seen == [3 * groups, 5 * groups] * 2  # two layers, P then Q


def test_scaling_defaults_to_the_inverse_square_root_of_head_dim(tiny_llama):
    from kvdrift.lm.engine.shared_attention import shared_prompt_attention

    pair = LMKernelPair(tiny_llama, _prompt(20), "snapkv-half")
    cache = pair.start("q", 2).cache
    g = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(2, n, 1, 16, generator=g) for n in (4, 2, 2))
    extra = dict(kvdrift_cache=cache, kvdrift_slots=torch.ones(2, 1, dtype=torch.bool))
    module = pair._modules[0]
    default, _ = shared_prompt_attention(module, q, k, v, None, **extra)
    given, _ = shared_prompt_attention(module, q, k, v, None, scaling=16 ** -0.5, **extra)
    other, _ = shared_prompt_attention(module, q, k, v, None, scaling=0.5, **extra)
    assert torch.equal(default, given) and not torch.allclose(default, other)


def test_bfloat16_under_masks_on_both_prompt_paths(prompt_path):
    """Masks and probabilities in the model's half precision (the fused kernel takes its mask
    in the query's dtype; matrix products need one dtype)."""
    pair = LMKernelPair(_model(dtype=torch.bfloat16), _prompt(60), "adakv-snapkv:ratio=0.5")
    state = pair.start("q", 3)
    for t in range(3):
        state = pair.advance(state, _tokens(3, 3, seed=22)[:, t])
    assert bool(torch.isfinite(state.logits).all())


def test_cuda_kernel_calls_mirror_the_cpu_path(monkeypatch):
    """The CUDA branch (no GPU here) with PyTorch's two kernels replaced by a math stand-in
    that checks what they are handed: the same scaled queries and additive mask as on CPU,
    the mask's last axis 16-aligned in memory, the efficient kernel's padded log-sum-exp
    sliced back. Its results must equal the CPU path's."""
    from kvdrift.lm.engine import shared_attention

    calls = []

    def reference(q, k, v, bias):
        scores = q @ k.transpose(-2, -1) + (0 if bias is None else bias)
        lse = torch.logsumexp(scores, -1)
        return torch.softmax(scores, -1) @ v, lse

    def efficient(q, k, v, bias, compute_lse, dropout, causal, scale):
        assert compute_lse and dropout == 0.0 and not causal and scale == 1.0
        assert bias is None or (bias.shape == q.shape[:3] + k.shape[2:3] and bias.stride(-1) == 1
                                and all(s % 16 == 0 for s in bias.stride()[:-1]))
        calls.append("efficient")
        out, lse = reference(q, k, v, bias)
        padded = torch.full(lse.shape[:-1] + (-(-lse.shape[-1] // 32) * 32,), 7.0)
        padded[..., :lse.shape[-1]] = lse
        return out, padded, None, None

    def flash(q, k, v, dropout, causal, debug, scale):
        assert scale == 1.0 and q.dtype in (torch.float16, torch.bfloat16)
        calls.append("flash")
        out, lse = reference(q.float(), k.float(), v.float(), None)
        return (out.to(q.dtype), lse) + (None,) * 7

    monkeypatch.setattr(shared_attention, "_cuda_kernels", lambda: (flash, efficient))
    g = torch.Generator().manual_seed(30)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    k, v = torch.randn(2, 3, 21, 8, generator=g), torch.randn(2, 3, 21, 8, generator=g)
    hidden = torch.rand(2, 1, 1, 21, generator=g) < 0.3
    bias = shared_attention.hidden_bias(hidden, q.dtype)
    out, lse = shared_attention._cuda_attention(q, k, v, bias)
    want_out, want_lse = shared_attention._FLASH_CPU(q, k, v, attn_mask=bias, scale=1.0)
    assert calls == ["efficient"] and lse.shape == (2, 3, 5)
    assert (out - want_out).abs().max() < 1e-5 and (lse - want_lse).abs().max() < 1e-5
    out, lse = shared_attention._cuda_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), None)
    assert calls[-1] == "flash" and lse.dtype == torch.float32 and lse.shape == (2, 3, 5)
