"""Quantization actions: numerics against references, the pair against ``generate`` with a
reference quantized cache, row independence, no-ops, chains and bad specs."""

from __future__ import annotations

import contextlib

import gguf
import numpy as np
import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.engine.prefill import prefill, prefill_shared
from kvdrift.lm.quantized.numerics import (
    GGUF_TYPES,
    fp8_roundtrip,
    gguf_roundtrip,
    minmax_roundtrip,
)
from kvdrift.lm.quantized.transform import KIVIQuantization
from tests.test_lm_pair import greedy

TOL = 5e-5


@pytest.fixture(scope="module")
def llama64():
    """A 2-layer random Llama with head_dim 64 (llama.cpp blocks of 32 fit), float32."""
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=1024, initializer_range=0.2,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed))


# --- numerics ------------------------------------------------------------------------------


def _blocks_with_edge_cases() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 2, 9, 64, generator=gen) * torch.rand(6, 2, 9, 1, generator=gen) * 8
    x[0, 0, 0, :32] = 0.0  # all-zero block (scale 0)
    x[0, 0, 1, :32] = 1.5  # constant block
    x[0, 0, 2, :32] = -2.0
    x[0, 0, 3, :2] = torch.tensor([3.0, -3.0])  # magnitude tie: the first wins
    x[0, 0, 4] = x[0, 0, 4] * 1e-3  # tiny
    return x


@pytest.mark.parametrize("name", list(GGUF_TYPES))
def test_gguf_types_equal_gguf_quants_entry_by_entry(name):
    x = _blocks_with_edge_cases()
    qtype = getattr(gguf.GGMLQuantizationType, name.upper())
    ref = gguf.quants.dequantize(gguf.quants.quantize(x.numpy(), qtype), qtype)
    ours = gguf_roundtrip(x, name).numpy()
    assert np.array_equal(ref.view(np.uint32), ours.view(np.uint32))  # bit for bit, signs too


def _kivi_reference(x: torch.Tensor, bits: int, group: int, along_tokens: bool) -> torch.Tensor:
    """A few-line KIVI min-max quantizer, group by group ([tokens, dim])."""
    out = x.clone()
    top = 2 ** bits - 1
    tokens, dim = x.shape
    for a in range(0, tokens if along_tokens else dim, group):
        for b in range(dim if along_tokens else tokens):
            g = x[a:a + group, b] if along_tokens else x[b, a:a + group]
            lo, hi = g.min(), g.max()
            scale = (hi - lo) / top
            code = torch.zeros_like(g) if scale == 0 else torch.clamp(torch.round((g - lo) / scale),
                                                                        0, top)
            if along_tokens:
                out[a:a + group, b] = code * scale + lo
            else:
                out[b, a:a + group] = code * scale + lo
    return out


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_kivi_numerics_equal_a_few_line_reference(bits):
    gen = torch.Generator().manual_seed(bits)
    x = torch.randn(64, 32, generator=gen)
    x[:16, 3] = 0.5  # a constant key group
    keys = minmax_roundtrip(x[None, None], bits, 16, dim=2)[0, 0]
    values = minmax_roundtrip(x[None, None], bits, 16, dim=3)[0, 0]
    assert torch.allclose(keys, _kivi_reference(x, bits, 16, True), atol=1e-6, rtol=0)
    assert torch.allclose(values, _kivi_reference(x, bits, 16, False), atol=1e-6, rtol=0)


def test_kivi_prompt_rule_quantizes_whole_residual_blocks_and_keeps_the_tail():
    q = KIVIQuantization(bits=2, group=16, residual=32)
    gen = torch.Generator().manual_seed(1)
    k, v = torch.randn(1, 2, 75, 64, generator=gen), torch.randn(1, 2, 75, 64, generator=gen)
    qk, qv = q.prompt(k, v)
    assert torch.equal(qk[:, :, 64:], k[:, :, 64:])  # 75 mod 32 = 11 keys full precision
    assert torch.equal(qv[:, :, 43:], v[:, :, 43:])  # the last 32 values full precision
    for h in range(2):
        assert torch.allclose(qk[0, h, :64], _kivi_reference(k[0, h, :64], 2, 16, True),
                              atol=1e-6, rtol=0)
        assert torch.allclose(qv[0, h, :43], _kivi_reference(v[0, h, :43], 2, 16, False),
                              atol=1e-6, rtol=0)


# --- reference caches for generate ---------------------------------------------------------


class GGUFReferenceCache(DynamicCache):
    """llama.cpp: every entry quantized by gguf.quants as it enters, before attention."""

    def __init__(self, k: str, v: str, **kwargs):
        super().__init__(**kwargs)
        self.types = [getattr(gguf.GGMLQuantizationType, t.upper()) for t in (k, v)]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        def rt(x, t):
            return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(
                x.numpy(), t), t))
        return super().update(rt(key_states, self.types[0]), rt(value_states, self.types[1]),
                              layer_idx, *args, **kwargs)


class KIVIReferenceCache(DynamicCache):
    """kvdrift's KIVI rule, written out: prefill attends in full precision, then the prompt is
    quantized once (keys in whole residual blocks, all values but the last residual); generated
    entries follow KIVI's streaming rule among themselves (quantized after the step)."""

    def __init__(self, bits: int, group: int, residual: int, **kwargs):
        super().__init__(**kwargs)
        self.bits, self.group, self.residual = bits, group, residual
        self.prompt: dict[int, tuple] = {}
        self.gen: dict[int, list] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        b, r, g = self.bits, self.residual, self.group
        if layer_idx not in self.prompt:  # the prefill: full precision, then quantize
            k, v = key_states[0], value_states[0]  # [kv, n, d]
            qk, qv = k.clone(), v.clone()
            n = k.shape[1]
            for h in range(k.shape[0]):
                kq, vq = n - n % r, max(0, n - r)
                qk[h, :kq] = _kivi_reference(k[h, :kq], b, g, True)
                if vq:
                    qv[h, :vq] = _kivi_reference(v[h, :vq], b, g, False)
            self.prompt[layer_idx] = (qk, qv)
            self.gen[layer_idx] = []
            super().update(key_states, value_states, layer_idx, *args, **kwargs)
            return key_states, value_states
        before = len(self.gen[layer_idx])
        self.gen[layer_idx].append((key_states[0, :, 0], value_states[0, :, 0]))
        gk = torch.stack([e[0] for e in self.gen[layer_idx]], 1)  # [kv, L + 1, d]
        gv = torch.stack([e[1] for e in self.gen[layer_idx]], 1)
        kq, vq = before // r * r, max(0, before - r)
        for h in range(gk.shape[0]):
            if kq:
                gk[h, :kq] = _kivi_reference(gk[h, :kq], b, g, True)
            if vq:
                gv[h, :vq] = _kivi_reference(gv[h, :vq], b, g, False)
        pk, pv = self.prompt[layer_idx]
        super().update(key_states, value_states, layer_idx, *args, **kwargs)  # lengths
        return torch.cat([pk, gk], 1)[None], torch.cat([pv, gv], 1)[None]


def _generate(model, ids, steps, cache) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=steps, min_new_tokens=steps, past_key_values=cache)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("k,v", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q5_1", "q4_1"),
                                 ("f16", "q5_0")])
def test_gguf_greedy_equals_generate_with_a_gguf_quants_cache(llama64, k, v):
    ids, steps = prompt(60, seed=3), 100
    pair = LMKernelPair(llama64, ids, f"gguf:k={k},v={v}")
    expected = _generate(llama64, ids, steps, GGUFReferenceCache(k, v, config=llama64.config))
    assert greedy(pair, "q", steps) == expected


@pytest.mark.parametrize("spec", ["kivi:bits=2,group=16,residual=32",
                                  "kivi:bits=4,group=32,residual=64", "kivi:bits=2"])
def test_kivi_greedy_equals_generate_with_a_reference_kivi_cache(llama64, spec):
    ids, steps = prompt(75, seed=4), 110
    q = parse_action(spec).quantization
    pair = LMKernelPair(llama64, ids, spec)
    cache = KIVIReferenceCache(q.bits, q.group, q.residual, config=llama64.config)
    assert greedy(pair, "q", steps) == _generate(llama64, ids, steps, cache)


# --- rows, truncation, no-ops, chains ------------------------------------------------------


def _advance(pair, state, tokens):
    for t in range(tokens.shape[1]):
        state = pair.advance(state, tokens[:, t])
    return state


@pytest.mark.parametrize("spec", ["kivi:bits=2,group=16,residual=16", "gguf:k=q4_0,v=q8_0"])
def test_a_rows_logits_do_not_depend_on_other_rows(llama64, spec):
    pair = LMKernelPair(llama64, prompt(50, seed=5), spec)
    gen = torch.Generator().manual_seed(6)
    tokens = torch.randint(3, 128, (4, 40), generator=gen)
    together = pair.logprobs(_advance(pair, pair.start("q", 4), tokens))
    for i in range(4):
        alone = pair.logprobs(_advance(pair, pair.start("q", 1), tokens[i:i + 1]))
        assert torch.allclose(together[i], alone[0], atol=TOL, rtol=0), i


def test_generated_view_is_per_row_exactly():
    q = KIVIQuantization(bits=2, group=4, residual=8)
    gen = torch.Generator().manual_seed(7)
    keys, values = torch.randn(3, 2, 21, 64, generator=gen), torch.randn(3, 2, 21, 64,
                                                                          generator=gen)
    steps = torch.arange(21).repeat(3, 1)
    valid = torch.ones(3, 21, dtype=torch.bool)
    before = torch.tensor([20, 20, 20])
    valid[1, 17:20] = False  # row 1 has holes
    bk, bv = q.generated(keys, values, steps, valid, before)
    for i in range(3):
        k1, v1 = q.generated(keys[i:i + 1], values[i:i + 1], steps[i:i + 1], valid[i:i + 1],
                             before[i:i + 1])
        assert torch.equal(bk[i], k1[0]) and torch.equal(bv[i], v1[0])


def test_kivi_truncate_then_continue_matches_a_fresh_history(llama64):
    spec = "kivi:bits=2,group=8,residual=16"
    pair = LMKernelPair(llama64, prompt(40, seed=8), spec)
    gen = torch.Generator().manual_seed(9)
    tokens = torch.randint(3, 128, (3, 40), generator=gen)
    state = pair.truncate(_advance(pair, pair.start("q", 3), tokens), torch.tensor([5, 17, 33]))
    more = torch.randint(3, 128, (3, 20), generator=gen)
    lp = pair.logprobs(_advance(pair, state, more))
    for i, length in enumerate([5, 17, 33]):
        history = torch.cat([tokens[i, :length], more[i]])[None]
        fresh = pair.logprobs(_advance(pair, pair.start("q", 1), history))
        assert torch.allclose(lp[i], fresh[0], atol=TOL, rtol=0), i


def _tv_along(pair, tokens):
    p, q = pair.start("p", tokens.shape[0]), pair.start("q", tokens.shape[0])
    tv = []
    for t in range(tokens.shape[1]):
        tv.append(0.5 * (pair.logprobs(p).exp() - pair.logprobs(q).exp()).abs().sum(-1))
        p, q = pair.advance(p, tokens[:, t]), pair.advance(q, tokens[:, t])
    return torch.stack(tv)


def test_gguf_f16_on_a_float16_model_and_a_kivi_residual_beyond_the_text_are_noops(llama64):
    tokens = torch.randint(3, 128, (2, 30), generator=torch.Generator().manual_seed(10))
    half = LlamaForCausalLM(llama64.config).eval()
    half.load_state_dict(llama64.state_dict())
    half = half.half()
    pair = LMKernelPair(half, prompt(40, seed=11), "gguf:k=f16,v=f16")
    assert not pair.q_is_p
    assert bool((_tv_along(pair, tokens) == 0).all())
    pair = LMKernelPair(llama64, prompt(40, seed=11), "kivi:bits=2,residual=128")
    assert bool((_tv_along(pair, tokens) == 0).all())  # 40 + 30 < 128: nothing quantized


def test_gguf_first_position_differs_and_kivi_first_position_is_p(llama64):
    ids = prompt(60, seed=12)
    tokens = torch.randint(3, 128, (1, 3), generator=torch.Generator().manual_seed(1))
    assert float(_tv_along(LMKernelPair(llama64, ids, "gguf:k=q4_0,v=q4_0"), tokens)[0]) > 0
    tv = _tv_along(LMKernelPair(llama64, ids, "kivi:bits=2,group=16,residual=16"), tokens)
    assert float(tv[0]) == 0 and float(tv[1]) > 0


@pytest.mark.parametrize("spec", ["snapkv:ratio=0.5+kivi:bits=4,group=16,residual=16",
                                  "kivi:bits=2,group=16,residual=32"])
def test_shared_prefill_equals_own_prefill_and_chains_quantize_what_is_kept(llama64, spec):
    ids = prompt(70, seed=13)
    action = parse_action(spec)
    shared = prefill_shared(llama64, ids, [action]).compressed[spec]
    own = prefill(llama64, ids, action)
    for a, b in zip(shared.keys + shared.values, own.keys + own.values, strict=True):
        assert torch.equal(a, b)
    evicted = prefill(llama64, ids, parse_action(spec.rpartition("+")[0] or "full"))
    for i in range(len(own.keys)):
        assert torch.equal(own.keys[i], action.quantization.prompt(evicted.keys[i],
                                                                   evicted.values[i])[0])


def test_gguf_after_eviction_keeps_the_press_count(llama64):
    pair = LMKernelPair(llama64, prompt(70, seed=14), "snapkv:ratio=0.5+gguf:k=q8_0,v=q8_0")
    assert pair.prompt_cache("q").kept == 35


# --- specs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec,message", [
    ("kivi:bits=3", r"^action 'kivi:bits=3': kivi bits must be one of 2, 4, 8; got 3$"),
    ("gguf:k=q3_k,v=q8_0",
     r"^action 'gguf:k=q3_k,v=q8_0': llama.cpp cache type for k= must be one of f16, q8_0, "
     r"q5_1, q5_0, q4_1, q4_0; got 'q3_k'$"),
    ("gguf:k=q8_0", "gguf needs k=TYPE,v=TYPE"),
    ("kivi:bits=2,group=32,residual=48", "multiple of group"),
    ("kivi:bits=2,size=4", r"^action 'kivi:bits=2,size=4': kivi field must be one of bits, "
                           r"group, residual; got 'size'$"),
    ("kivi:bits=2,4", r"^action 'kivi:bits=2,4': each field must be key=value; got '4'$"),
    ("kivi:bits=4+snapkv:ratio=0.5", "must come last"),
    ("decoding-knorm:interval=4,target=8+kivi:bits=2", r"not decoding-\* or head-adaptive"),
])
def test_bad_specs_get_one_line_naming_what_is_allowed(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_action(spec)
    assert "\n" not in str(info.value)


def test_a_group_that_does_not_divide_head_dim_is_refused(llama64):
    with pytest.raises(ValueError, match=r"must divide the model's head_dim \(64\)"):
        LMKernelPair(llama64, prompt(20), "kivi:bits=2,group=24,residual=48")


# --- memory --------------------------------------------------------------------------------


def test_kv_fraction_counts_bits_scales_and_full_precision_tails(llama64):
    ids = prompt(256, seed=15)
    fractions = {a: LMKernelPair(llama64, ids, a).kv_memory()[1] for a in (
        "full", "snapkv-half", "gguf:k=q8_0,v=q8_0", "gguf:k=q4_0,v=q4_0",
        "kivi:bits=4,residual=128", "kivi:bits=2,residual=128",
        "snapkv:ratio=0.5+kivi:bits=4,residual=32")}
    assert fractions["full"] == 1.0 and fractions["snapkv-half"] == 0.5
    assert fractions["gguf:k=q8_0,v=q8_0"] == 8.5 / 32  # float32 model
    assert fractions["gguf:k=q4_0,v=q4_0"] == 4.5 / 32
    # keys: 256 quantized; values: 128 quantized, 128 at 32 bits; scales 2 x 16 bits / 32
    assert fractions["kivi:bits=2,residual=128"] == (256 * 3 + 128 * 3 + 128 * 32) / (512 * 32)
    assert fractions["kivi:bits=4,residual=128"] == (256 * 5 + 128 * 5 + 128 * 32) / (512 * 32)
    assert fractions["snapkv:ratio=0.5+kivi:bits=4,residual=32"] == (
        128 * 5 + 96 * 5 + 32 * 32) / (512 * 32)


@pytest.mark.parametrize("spec", ["kivi:bits=2,group=4,residual=4", "gguf:k=q4_0,v=q8_0",
                                  "snapkv:ratio=0.5+kivi:bits=4,group=4,residual=4",
                                  "snapkv:ratio=0.5+fp8:e4m3"])
def test_joint_step_quantizes_each_q_row_as_separate_steps_do(llama64, spec):
    """P, Q-along-Y and forced rows in one model call: each Q row reads its generated entries
    quantized exactly as a separate step does (P rows stay unquantized)."""
    from tests.test_joint_step import assert_steps_agree

    assert_steps_agree(LMKernelPair(llama64, prompt(90), spec), steps=7)


# --- fp8 (vLLM / SGLang --kv-cache-dtype fp8) -----------------------------------------------

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _fp8_values(fmt: str) -> torch.Tensor:
    """Normal, subnormal, tie-at-half, zero and signed entries inside the format's range."""
    gen = torch.Generator().manual_seed(20)
    top = torch.finfo(FP8[fmt]).max
    x = torch.randn(3, 2, 17, 64, generator=gen) * torch.logspace(-9, 2, 64)
    x[0, 0, 0, :6] = torch.tensor([0.0, -0.0, top, -top, 2.0 ** -9, 1.0 + 2.0 ** -4])
    return x.clamp(-top, top)


@pytest.mark.parametrize("fmt", list(FP8))
@pytest.mark.parametrize("scale", [1.0, 0.37, 8.0])
def test_fp8_roundtrip_equals_pytorch_float8_bit_for_bit(fmt, scale):
    x = _fp8_values(fmt) * scale
    expected = (x / scale).to(FP8[fmt]).to(torch.float32) * scale
    ours = fp8_roundtrip(x, fmt, scale)
    assert ours.dtype == x.dtype
    assert torch.equal(ours.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("fmt", list(FP8))
def test_fp8_out_of_range_entries_saturate_as_the_engines_kernels_do(fmt):
    top = torch.finfo(FP8[fmt]).max
    x = torch.tensor([top * 1.5, -1e9, 1e9])
    assert fp8_roundtrip(x, fmt).tolist() == [top, -top, top]


def _double(model):
    """A float64 copy: float32 noise between two paths that should agree can move an entry
    across an fp8 rounding boundary (a step of 1/16 of the entry for e4m3)."""
    copy = LlamaForCausalLM(model.config).eval()
    copy.load_state_dict(model.state_dict())
    return copy.double()


class FP8ReferenceCache(DynamicCache):
    """vLLM's fp8 cache written out: every entry cast to PyTorch's float8 as it enters (scale
    1), before attention reads it."""

    def __init__(self, fmt: str, **kwargs):
        super().__init__(**kwargs)
        self.dtype = FP8[fmt]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(key_states.to(self.dtype).to(key_states.dtype),
                              value_states.to(self.dtype).to(key_states.dtype), layer_idx,
                              *args, **kwargs)


def _reference_logprobs(model, ids, tokens, cache, press=None) -> torch.Tensor:
    """Q's log-probabilities along ``tokens`` by plain forwards on ``cache`` (explicit
    positions: after eviction the cache is shorter than the text)."""
    ctx = press(model) if press is not None else contextlib.nullcontext()
    with torch.no_grad():
        with ctx:
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        rows = [out.logits[0, -1]]
        n = ids.shape[1]
        for t, token in enumerate(tokens.tolist()):
            out = model(input_ids=torch.tensor([[token]]), past_key_values=cache,
                        position_ids=torch.tensor([[n + t]]),
                        cache_position=torch.tensor([cache.get_seq_length()]), use_cache=True)
            rows.append(out.logits[0, -1])
    return torch.log_softmax(torch.stack(rows).double(), -1)


@pytest.mark.parametrize("spec", ["fp8:e4m3", "fp8:e5m2", "snapkv:ratio=0.5+fp8:e4m3"])
def test_fp8_step_logits_equal_a_reference_fp8_cache(llama64, spec):
    """The pair's Q logprobs along a history equal forwards on a cache that casts every entry
    to float8 as it enters (after the action's own press for the chain) within 1e-4
    (float64: see :func:`_double`)."""
    model = _double(llama64)
    ids, steps = prompt(70, seed=21), 30
    action = parse_action(spec)
    tokens = torch.randint(3, 128, (steps,), generator=torch.Generator().manual_seed(22))
    pair = LMKernelPair(model, ids, spec)
    press = action.make_press(ids.shape[1]) if action.stages else None
    expected = _reference_logprobs(model, ids, tokens,
                                   FP8ReferenceCache(action.quantization.format,
                                                     config=model.config), press)
    state, ours = pair.start("q", 1), []
    for token in tokens.tolist() + [None]:
        ours.append(pair.logprobs(state)[0])
        if token is not None:
            state = pair.advance(state, torch.tensor([token]))
    assert torch.allclose(torch.stack(ours), expected, atol=1e-4, rtol=0)
    if action.stages:
        assert pair.prompt_cache("q").kept == 35


@pytest.mark.parametrize("fmt", list(FP8))
def test_fp8_greedy_equals_generate_with_a_float8_cache(llama64, fmt):
    ids, steps = prompt(60, seed=23), 80
    expected = _generate(llama64, ids, steps, FP8ReferenceCache(fmt, config=llama64.config))
    assert greedy(LMKernelPair(llama64, ids, f"fp8:{fmt}"), "q", steps) == expected


def test_fp8_first_position_differs_and_rows_are_independent(llama64):
    ids = prompt(60, seed=12)
    tokens = torch.randint(3, 128, (1, 3), generator=torch.Generator().manual_seed(1))
    assert float(_tv_along(LMKernelPair(llama64, ids, "fp8:e5m2"), tokens)[0]) > 0
    pair = LMKernelPair(_double(llama64), prompt(50, seed=5), "fp8:e4m3")
    rows = torch.randint(3, 128, (3, 20), generator=torch.Generator().manual_seed(6))
    together = pair.logprobs(_advance(pair, pair.start("q", 3), rows))
    for i in range(3):
        alone = pair.logprobs(_advance(pair, pair.start("q", 1), rows[i:i + 1]))
        assert torch.allclose(together[i], alone[0], atol=TOL, rtol=0), i


def test_fp8_kv_bytes_are_one_byte_per_entry_plus_two_float32_scales_per_layer(llama64):
    ids = prompt(256, seed=15)
    # 2 layers x 2 KV heads x head_dim 64; the float32 full cache holds 4 bytes an entry
    per_layer = {"fp8:e4m3": 2 * 256 * 64 * 2 + 8, "fp8:e5m2,scale=2": 2 * 256 * 64 * 2 + 8,
                 "snapkv:ratio=0.5+fp8:e4m3": 2 * 128 * 64 * 2 + 8}
    for spec, layer in per_layer.items():
        kv_bytes, fraction = LMKernelPair(llama64, ids, spec).kv_memory()
        assert kv_bytes == 2 * layer
        assert fraction == layer / (2 * 256 * 64 * 2 * 4)


def test_fp8_specs_parse_and_bad_ones_get_one_line():
    q = parse_action("snapkv:ratio=0.5+fp8:E5M2,scale=0.5").quantization
    assert (q.format, q.scale, q.label) == ("e5m2", 0.5, "fp8:e5m2,scale=0.5")
    assert parse_action("fp8:e4m3").quantization.label == "fp8:e4m3"
    for spec, message in [("fp8:e3m4", r"^action 'fp8:e3m4': fp8 format must be one of e4m3, e5m2; "
                                       r"got 'e3m4'$"),
                          ("fp8:scale=2", "fp8 needs one format"),
                          ("fp8:e4m3,scale=0", r": fp8: scale must be a finite number > 0; "
                                               r"got 0.0$"),
                          ("fp8:e4m3,scale=x", "scale must be a number"),
                          ("fp8:e4m3,bits=4", r"^action 'fp8:e4m3,bits=4': fp8 field must be "
                                              r"one of scale; got 'bits'$"),
                          ("fp8:e4m3+snapkv:ratio=0.5", "must come last")]:
        with pytest.raises(ValueError, match=message) as info:
            parse_action(spec)
        assert "\n" not in str(info.value)
