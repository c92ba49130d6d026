"""Two generators on one tokenizer (docs/two-models.md): Q as another model than P.

- The grammar of ``<action>@<model>``, its refusals, and the one-tokenizer check (by hand).
- Quantized weights are exactly the ``gguf`` package's dequantized values, and their bytes the
  type's block sizes (identities).
- Exactness: at temperature 0 P's tokens are P's model's own ``generate`` and Q's are Q's
  model's own (int8 and int4 weights, bfloat16, eager attention, each with and without a press),
  over 256 positions on a tiny model (the slow lane repeats it on the embedded SmolLM2); sampled
  TVs, log-probabilities and KL equal an independent replay from the two models' logits.
- A draft model: kvdrift's predicted acceptance against Leviathan et al.'s speculative sampler
  run with that draft (false alarm below 1e-4, fixed seeds).
- Runs, stores and the Python API: both models in the fingerprint, a changed Q refused on
  resume, a model handed over as Q, refusals with nothing written.
"""

from __future__ import annotations

import copy
import json
import re
from importlib import metadata

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from kvdrift.estimate.rollout import coupled_rollouts
from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.generators.build import build_generator
from kvdrift.lm.generators.pair import GeneratorPair
from kvdrift.lm.generators.tokenizers import tokenizer_difference
from kvdrift.lm.generators.weights import quantize_weights, quantized_linears
from kvdrift.lm.grammar.model_spec import ModelSpec, parse_model
from kvdrift.lm.loading.model import LoadedModel
from kvdrift.run.fingerprint import METADATA_KEY as FINGERPRINT_KEY
from tests.messages import whole
from tests.test_lm_pair import generate_greedy, greedy

Q_KINDS = ["int8", "int4", "bfloat16", "eager"]


class _Tokenizer:
    """The least a tokenizer must offer the one-tokenizer check (a vocabulary of 128 ids)."""

    special_tokens_map = {"eos_token": "2"}
    chat_template = None
    backend_tokenizer = None

    def __init__(self, vocab=128):
        self.vocab = {str(i): i for i in range(vocab)}

    def get_vocab(self):
        return self.vocab

    def encode(self, text, **_):
        return [1]


def loaded(model) -> LoadedModel:
    return LoadedModel(model, _Tokenizer(), "tiny", torch.device("cpu"),
                       next(model.parameters()).dtype)


def prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def two_models(p_model, q_model, ids, action: str) -> GeneratorPair:
    """The pair the factory builds: P's full cache against the action's cache on Q's model."""
    whole_action = parse_action(action)
    q_loaded = loaded(q_model)
    from kvdrift.lm.generators.build import Generator

    return GeneratorPair(LMKernelPair(p_model, ids, "full"),
                         LMKernelPair(q_model, ids, whole_action.cache_action),
                         whole_action, Generator(q_loaded, action, 0))


# --- grammar ---------------------------------------------------------------------------------


def test_model_part_grammar_by_hand():
    a = parse_action("snapkv-half@int4")
    assert a.model == ModelSpec(weights="q4_0") and a.cache_action.name == "snapkv-half"
    assert a.cache_action.stages == parse_action("snapkv-half").stages and not a.is_noop(100)
    assert parse_action("full@int8").model.weights == "q8_0"
    spec = parse_model("./draft+bfloat16+eager+q5_1")
    assert (spec.checkpoint, spec.dtype, spec.attention, spec.weights) == (
        "./draft", "bfloat16", "eager", "q5_1")
    assert spec.text == "./draft+q5_1+bfloat16+eager"
    assert "on Q's model: P's weights, linear weights as llama.cpp's Q4_0" in \
        parse_action("full@int4").kvpress_call()
    chained = parse_action("snapkv:ratio=0.5+kivi:bits=4@int8")
    assert chained.quantization is not None and chained.model.weights == "q8_0"


@pytest.mark.parametrize("spec,message", [
    ("full@int9", "weight type must be one of int8, int4, q8_0, q5_1, q5_0, q4_1, q4_0, "
                  "mxfp4; got 'int9'"),
    ("full@q3_k", "weight type must be one of int8, int4, q8_0, q5_1, q5_0, q4_1, q4_0, "
                  "mxfp4; got 'q3_k'"),
    ("full@int4+q8_0", "Q's model names its weights twice ('q8_0')"),
    ("full@bfloat16+float16", "Q's model names its dtype twice ('float16')"),
    ("full@a+b", "Q's model names its checkpoint twice ('b')"),
    ("full@", "the model after '@' must be parts joined with '+'"),
    ("@int4", "name what is done to Q's cache before '@' (full@int4 for Q's full cache)"),
    ("full@int4++eager", "an empty part in the model 'int4++eager'"),
    ("snapkv:ratio=2@int4", "ratio"),
])
def test_model_part_refusals_name_the_part(spec, message):
    from kvdrift.lm.grammar.names import check_action_names

    pattern = f"^action {re.escape(repr(spec))}: .*{re.escape(message)}"
    with pytest.raises(ValueError, match=pattern) as parsed:
        parse_action(spec)
    assert "\n" not in str(parsed.value)
    if message != "ratio":  # the fast check, before kvpress loads, says the same
        with pytest.raises(ValueError, match=pattern):
            check_action_names(spec)


# --- weights and tokenizers ------------------------------------------------------------------


@pytest.mark.parametrize("kind,bytes_per_block", [("q8_0", 34), ("q4_0", 18), ("q4_1", 20),
                                                  ("q5_0", 22), ("q5_1", 24)])
def test_quantized_weights_are_gguf_values_and_block_bytes(tiny_llama, kind, bytes_per_block):
    import gguf.quants
    from gguf import GGMLQuantizationType

    model = copy.deepcopy(tiny_llama)
    before = {n: m.weight.detach().clone() for n, m in quantized_linears(model)}
    head = model.lm_head.weight.detach().clone()
    done = quantize_weights(model, kind)
    values = 0
    for name, module in quantized_linears(model):
        t = GGMLQuantizationType[kind.upper()]
        want = gguf.quants.dequantize(gguf.quants.quantize(before[name].numpy(), t), t)
        assert np.array_equal(module.weight.detach().numpy(), want), name
        assert not torch.equal(module.weight, before[name])
        values += before[name].numel()
    assert torch.equal(model.lm_head.weight, head)  # the output head keeps its precision
    assert done.layers == len(before) == 14  # 2 layers x (q, k, v, o, gate, up, down)
    assert done.quantized_bytes == values // 32 * bytes_per_block
    others = sum(p.numel() * 4 for n, p in model.named_parameters()
                 if not any(n == f"{m}.weight" for m in before))
    assert done.other_bytes == others


def test_tokenizer_difference_says_what_differs():
    p, q = _Tokenizer(), _Tokenizer()
    assert tokenizer_difference(p, q) is None
    q.vocab = {**p.vocab, "extra": 128}
    assert tokenizer_difference(p, q) == ("the vocabularies differ (128 vs 129 tokens: 1 tokens "
                                          "only Q's (e.g. 'extra'))")
    q.vocab = {**p.vocab, "5": 6, "6": 5}
    assert "2 tokens with other ids (e.g. '5': 5 vs 6)" in tokenizer_difference(p, q)
    q = _Tokenizer()
    q.special_tokens_map = {"eos_token": "3"}
    assert tokenizer_difference(p, q) == "the special tokens differ (eos_token: '2' vs '3')"
    q = _Tokenizer()
    q.chat_template = "{{ messages }}"
    assert tokenizer_difference(p, q) == "the chat templates differ"


def test_build_leaves_p_untouched_and_refuses_unquantizable_rows(tiny_llama):
    from transformers import LlamaConfig, LlamaForCausalLM

    before = {k: v.clone() for k, v in tiny_llama.state_dict().items()}
    g = build_generator(loaded(tiny_llama), parse_model("int4+bfloat16+eager"))
    assert g.loaded.dtype == torch.bfloat16 and g.loaded.model is not tiny_llama
    assert g.loaded.model.config._attn_implementation == "eager"
    assert tiny_llama.config._attn_implementation == "sdpa"
    assert all(torch.equal(v, tiny_llama.state_dict()[k]) for k, v in before.items())
    odd = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=80,
                                       num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=2)).eval()
    with pytest.raises(ValueError, match=whole(
            "weight type q4_0 quantizes rows in blocks of 32; layer model.layers.0.mlp.down_proj "
            "has 80 inputs, not a multiple of 32 (use a dtype instead, e.g. @bfloat16)")):
        build_generator(loaded(odd), parse_model("int4"))


def test_pair_refuses_another_vocabulary(tiny_llama):
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(LlamaConfig(**{**tiny_llama.config.to_dict(),
                                            "vocab_size": 256})).eval()
    with pytest.raises(ValueError, match=whole(
            "Q's model 'full@x' scores 256 tokens and P's 128; the two must score one "
            "vocabulary")):
        two_models(tiny_llama, other, prompt(20), "full@x")


# --- exact: generate, and an independent replay ----------------------------------------------


@pytest.fixture(scope="module")
def q_models(tiny_llama):
    return {kind: build_generator(loaded(tiny_llama), parse_model(kind)).loaded.model
            for kind in Q_KINDS}


@pytest.mark.parametrize("kind", Q_KINDS)
@pytest.mark.parametrize("action", ["full", "snapkv-half"])
def test_greedy_sides_are_each_models_own_generate(tiny_llama, q_models, kind, action):
    ids = prompt(90, seed=4)
    q_model = q_models[kind]
    pair = two_models(tiny_llama, q_model, ids, f"{action}@{kind}")
    steps = 256
    assert greedy(pair, "p", steps) == generate_greedy(tiny_llama, ids, steps)
    press = parse_action(action).make_press(ids.shape[1])
    q_tokens = greedy(pair, "q", steps)
    want, logits = generate_with_logits(q_model, ids, steps, press)
    if kind == "bfloat16":  # exact up to a tie at bfloat16's resolution (docs/two-models.md)
        assert_equal_up_to_a_tie(q_tokens, want, logits)
    else:
        assert q_tokens == want
    if action == "full" and kind in ("int4", "bfloat16"):  # Q is another model indeed
        assert q_tokens != greedy(pair, "p", steps)


def generate_with_logits(model, ids, steps, press=None):
    """``generate``'s greedy tokens and its logits ``[steps, V]`` (kvpress's usage)."""
    import contextlib

    ctx = press(model) if press is not None else contextlib.nullcontext()
    with ctx, torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=steps, min_new_tokens=steps, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences[0, ids.shape[1]:].tolist(), torch.cat(out.logits)


def assert_equal_up_to_a_tie(got, want, logits, dtype=torch.bfloat16):
    """``got == want``, or the first position where they differ is a tie in ``generate``'s
    own ``logits`` there (of a model in ``dtype``): its top two logits equal, or one unit in
    the last place apart (a tie another kernel's rounding may break the other way)."""
    first = next((t for t, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
    if first is None:
        return
    top = logits[first].topk(2)
    ulp = float(torch.finfo(dtype).eps) * float(top.values[0].abs())
    assert {got[first], want[first]} == set(top.indices.tolist()), first
    assert float(top.values[0] - top.values[1]) <= ulp, (first, top.values.tolist())


def replay(model, ids, tokens, temperature):
    """Log-probabilities ``[steps, V]`` of a model's plain forward over prompt + tokens."""
    n = ids.shape[1]
    with torch.no_grad():
        logits = model(torch.cat([ids, tokens[None, :-1]], dim=1)).logits[0, n - 1:]
    return torch.log_softmax(logits.double() / temperature, -1)


@pytest.mark.parametrize("kind", ["int4", "int8", "eager"])
def test_sampled_tvs_equal_an_independent_replay(tiny_llama, q_models, kind):
    """Every recorded TV, fixed-history TV, KL and log-probability along the sampled paths
    equals a plain forward of each model over prompt + path, to 1e-4 (float32 models; a
    bfloat16 model agrees with any other kernel only to bfloat16's resolution)."""
    ids = prompt(70, seed=6)
    q_model = q_models[kind]
    pair = two_models(tiny_llama, q_model, ids, f"full@{kind}")
    T, K, H = 0.9, 4, 24
    r = coupled_rollouts(pair, K, H, temperature=T, seed=3)
    if kind != "eager":  # other weights: some replicates part (eager: float noise only)
        assert (r.tau > 0).any()
    worst = 0.0
    for i in range(K):
        lp_x = replay(tiny_llama, ids, r.x[i], T)
        lq_y = replay(q_model, ids, r.y[i], T)
        lq_x = replay(q_model, ids, r.x[i], T)
        live = ~torch.cat([torch.zeros(1, dtype=torch.bool), r.x_eos[i, :-1] | r.y_eos[i, :-1]])
        delta = 0.5 * (lp_x.exp() - lq_y.exp()).abs().sum(-1)
        fixed = 0.5 * (lp_x.exp() - lq_x.exp()).abs().sum(-1)
        kl = (lp_x.exp() * (lp_x - lq_x)).sum(-1)
        rows = torch.arange(H)
        for got, want in ((r.delta[i], delta), (r.f[i], fixed), (r.kl[i], kl),
                          (r.logp_x[i], lp_x[rows, r.x[i]]), (r.logq_x[i], lq_x[rows, r.x[i]])):
            worst = max(worst, float((got[live] - want[live]).abs().max()))
    assert worst < 1e-4, worst


def test_rollouts_run_one_forward_per_side(tiny_llama, q_models):
    """A joint step of P's and Q's rows calls each model once per position."""
    ids = prompt(40, seed=1)
    q_model = q_models["int8"]
    calls = {"p": 0, "q": 0}
    hooks = [tiny_llama.register_forward_pre_hook(lambda *_: calls.__setitem__("p",
                                                                               calls["p"] + 1)),
             q_model.register_forward_pre_hook(lambda *_: calls.__setitem__("q", calls["q"] + 1))]
    try:
        pair = two_models(tiny_llama, q_model, ids, "snapkv-half@int8")
        before = dict(calls)
        coupled_rollouts(pair, 3, 10, temperature=1.0, seed=0)
    finally:
        for h in hooks:
            h.remove()
    assert calls["p"] - before["p"] == 9 and calls["q"] - before["q"] == 9


# --- a draft model: speculative sampling ------------------------------------------------------


def test_draft_model_acceptance_matches_speculative_sampling(tiny_llama):
    """kvdrift's acceptance ``1 - F`` and tokens per round for a draft model (P's weights plus
    noise, another model) against Leviathan et al.'s sampler run with that draft; |z| < 3.89
    per comparison (false alarm 1e-4 each, three comparisons), fixed seeds."""
    from tests.test_readings import _Decoder, assert_speculative_agrees, speculative_runs

    draft = copy.deepcopy(tiny_llama)
    with torch.no_grad():
        g = torch.Generator().manual_seed(9)
        for p in draft.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    ids = prompt(60, seed=8)
    steps, runs = 12, 200
    pair = two_models(tiny_llama, draft, ids, "full@draft")
    r = coupled_rollouts(pair, 400, steps, seed=1)
    gammas = [4] * runs + [steps] * runs
    results = speculative_runs(_Decoder(tiny_llama, ids, len(gammas)),
                               _Decoder(draft, ids, len(gammas)), gammas, steps,
                               pair.eos_token_id, seed=2)
    predicted = assert_speculative_agrees(r, results, gammas, steps)
    assert 0.2 < predicted["acceptance"][0] < 0.99  # a draft that is neither P nor useless


# --- runs, stores, the Python API --------------------------------------------------------------


def _docs(tmp_path):
    path = tmp_path / "docs.jsonl"
    rows = [{"id": f"d{i}", "prompt": f"Tell me about topic {i}: " + "words and more " * 12}
            for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_run_records_both_models_and_refuses_another_q(tmp_path, tiny_model_dir_hd64):
    import shutil

    import kvdrift

    draft = tmp_path / "draft"
    shutil.copytree(tiny_model_dir_hd64, draft)
    docs = _docs(tmp_path)
    out = tmp_path / "run"
    actions = ["full@int8", "snapkv-half@bfloat16", f"full@{draft}"]
    m = kvdrift.measure(str(tiny_model_dir_hd64), actions, docs, out, replicates=2, horizon=6,
                        bootstrap=0, device="cpu")
    reps = m.records.replicates
    assert sorted(set(reps["action"])) == sorted(actions)
    prints = {}
    for path in (out / "replicates").glob("*.parquet"):
        meta = pq.read_schema(path).metadata
        action = json.loads(meta[b"kvdrift.unit"])[2] if b"kvdrift.unit" in meta else None
        prints[action] = json.loads(meta[FINGERPRINT_KEY])
    assert prints["full@int8"]["q_model"] == {
        "model": "q8_0", "checkpoint": None, "dtype": None, "attention": None,
        "weights": "q8_0", "quantizer": f"gguf {metadata.version('gguf')}"}
    assert prints["snapkv-half@bfloat16"]["q_model"]["dtype"] == "bfloat16"
    assert len(prints[f"full@{draft}"]["q_model"]["files_sha256"]) == 64
    assert prints["full@int8"]["weights_sha256"] == prints[f"full@{draft}"]["weights_sha256"]
    described = json.loads((out / "run.json").read_text())["presses"]
    assert described["full@int8"]["kvpress"].endswith(
        "on Q's model: P's weights, linear weights as llama.cpp's Q8_0 (8.5 bits per weight, "
        "gguf's quantizer)")
    # Q's cache on Q's model: bfloat16 entries are half of P's float32 ones, kv_fraction of Q's
    bf16 = reps[reps.action == "snapkv-half@bfloat16"]
    assert (bf16["kv_fraction"] < 0.55).all() and (bf16["kv_fraction"] > 0.45).all()
    # the draft's files change: its units are refused on resume, naming the unit
    (draft / "config.json").write_text((draft / "config.json").read_text().replace(
        '"rms_norm_eps": 1e-06', '"rms_norm_eps": 2e-06'))
    with pytest.raises(ValueError, match="is not mixed in"):
        kvdrift.measure(str(tiny_model_dir_hd64), actions, docs, out, replicates=2, horizon=6,
                        bootstrap=0, device="cpu")


def test_model_handed_over_as_q(tmp_path, tiny_model_dir_hd64):
    import kvdrift
    from kvdrift.lm.loading.model import load_model

    p = load_model(str(tiny_model_dir_hd64))
    q = load_model(str(tiny_model_dir_hd64), dtype="bfloat16")
    q_model = kvdrift.Model(q.model, q.tokenizer, "bf16-copy")
    hooks_before = dict(q.model._forward_hooks)
    m = kvdrift.measure(kvdrift.Model(p.model, p.tokenizer, "tiny"),
                        {"bf16": q_model, "snapkv-half": "snapkv-half"}, _docs(tmp_path),
                        replicates=2, horizon=5, bootstrap=0)
    assert set(m.records.replicates["action"]) == {"bf16", "snapkv-half"}
    assert dict(q.model._forward_hooks) == hooks_before
    assert q.model.config._attn_implementation == "sdpa"
    other = copy.deepcopy(q.tokenizer)
    other.chat_template = "{{ messages }}"
    out = tmp_path / "refused"
    with pytest.raises(ValueError, match=whole(
            "Q's model 'mine' is not on P's tokenizer: the chat templates differ; kvdrift "
            "compares two generators over one vocabulary and one prompt")):
        kvdrift.measure(kvdrift.Model(p.model, p.tokenizer, "tiny"),
                        {"mine": kvdrift.Model(q.model, other, "mine")}, _docs(tmp_path), out,
                        replicates=2, horizon=5)
    assert not out.exists()


def test_refusals_write_nothing(tmp_path, tiny_model_dir_hd64):
    import kvdrift

    docs = _docs(tmp_path)
    out = tmp_path / "refused"
    with pytest.raises(ValueError, match=whole(
            "action 'full@int3': weight type must be one of int8, int4, q8_0, q5_1, q5_0, "
            "q4_1, q4_0, mxfp4; got 'int3'")):
        kvdrift.measure(str(tiny_model_dir_hd64), ["full@int3"], docs, out, replicates=2,
                        horizon=4)
    assert not out.exists()
    other = tmp_path / "other-template"  # another chat template: refused before weights load
    import shutil

    shutil.copytree(tiny_model_dir_hd64, other)
    template = other / "chat_template.jinja"
    template.write_text(template.read_text() + "{# another template #}")
    (other / "model.safetensors").write_bytes(b"not weights")  # never read
    with pytest.raises(ValueError, match=whole(
            f"action 'full@{other}': Q's model '{other}' is not on P's tokenizer: the chat "
            f"templates differ; kvdrift compares two generators over one vocabulary and one "
            f"prompt")):
        kvdrift.measure(str(tiny_model_dir_hd64), [f"full@{other}"], docs, out, replicates=2,
                        horizon=4)
    assert not out.exists()
    with pytest.raises(ValueError, match="attribution compares P's and Q's prompt caches on one "
                                         "model; action 'full@int8' runs Q on another model"):
        kvdrift.measure(str(tiny_model_dir_hd64), ["full@int8"], docs, out, replicates=2,
                        horizon=4, attribution=True)
    assert not out.exists()


# --- the embedded model (slow lane) ---------------------------------------------------------


@pytest.mark.slow
def test_smollm2_sides_are_each_models_own_generate(embedded_smollm2):
    """The embedded SmolLM2 against its int8 and int4 copies, bfloat16 and eager attention:
    each side's greedy tokens over 256 positions are its own model's ``generate`` (bfloat16:
    up to a tie at its resolution; a press on Q's model: the fast lane)."""
    from kvdrift.lm.loading.model import encode_prompt

    lm = embedded_smollm2
    text = ("Here is a licence: permission is granted to use, copy, modify and distribute this "
            "software for any purpose, provided that the notice above appears in all copies. ")
    ids = encode_prompt(lm.tokenizer, text * 3 + "Write a long commentary on this licence.")
    steps = 256
    assert greedy(LMKernelPair(lm, ids, "full"), "p", steps) == generate_greedy(lm.model, ids,
                                                                                 steps)
    for action in ("full@int8", "full@int4", "full@bfloat16", "full@eager"):
        whole_action = parse_action(action)
        q = build_generator(lm, whole_action.model).loaded.model
        pair = two_models(lm.model, q, ids, action)
        press = whole_action.cache_action.make_press(ids.shape[1])
        want, logits = generate_with_logits(q, ids, steps, press)
        got = greedy(pair, "q", steps)
        if whole_action.model.dtype == "bfloat16":
            assert_equal_up_to_a_tie(got, want, logits)
        else:
            assert got == want, action
        del pair, q


def test_every_reading_runs_on_two_models(tmp_path, tiny_model_dir_hd64):
    """Rollouts with depths (the interval), SWRB, the report, task-free analysis and ``show``
    on a moved store run unchanged for a Q on another model; SWRB's and rollouts' R agree
    with each other within their standard errors (|z| < 4.5, false alarm below 1e-5)."""
    import shutil

    from typer.testing import CliRunner

    from kvdrift.cli import app

    docs = _docs(tmp_path)
    runner = CliRunner()
    runs = {}
    for estimator in ("rollout", "swrb"):
        out = tmp_path / estimator
        result = runner.invoke(app, [
            "run", "--model", str(tiny_model_dir_hd64), "--docs", str(docs), "--actions",
            "full@int4,snapkv-half@int8", "--replicates", "24", "--horizon", "6", "--depths",
            "2", "--estimator", estimator, "--device", "cpu", "--out", str(out), "--json"])
        assert result.exit_code == 0, result.output
        runs[estimator] = out
    report = runner.invoke(app, ["report", str(runs["rollout"]), "--bootstrap", "50"])
    assert report.exit_code == 0, report.output
    html = (runs["rollout"] / "report" / "report.html").read_text()
    assert "full@int4" in html and "snapkv-half@int8" in html
    analysis = json.loads((runs["rollout"] / "report" / "analysis.json").read_text())
    assert {a["action"] for a in analysis["actions"]} == {"full@int4", "snapkv-half@int8"}
    moved = tmp_path / "moved"
    shutil.move(runs["rollout"], moved)
    shown = runner.invoke(app, ["show", str(moved), "--action", "full@int4"])
    assert shown.exit_code == 0, shown.output
    assert re.search(r"·\s+full@int4\s+·\s+replicate", shown.output)  # the heading wraps
    assert "\nP: " in shown.output
    import kvdrift

    r = {e: kvdrift.load_records(tmp_path / ("moved" if e == "rollout" else e)).replicates
         for e in runs}
    for action in ("full@int4", "snapkv-half@int8"):
        a = r["rollout"][r["rollout"].action == action]["risk"].to_numpy()
        b = r["swrb"][r["swrb"].action == action]["risk"].to_numpy()
        se = np.hypot(a.std(ddof=1) / np.sqrt(a.size), b.std(ddof=1) / np.sqrt(b.size))
        assert abs(a.mean() - b.mean()) < 4.5 * max(se, 1e-9), (action, a.mean(), b.mean())


def test_models_that_do_not_fit_or_need_their_own_code_are_refused_first(
        tmp_path, tiny_model_dir_hd64, monkeypatch):
    """Before any weights load, nothing written: P and Q's weights larger than the memory
    free (read from their files), and a checkpoint whose config asks for its own code."""
    import shutil

    import kvdrift
    from kvdrift.lm.generators import build

    docs, out = _docs(tmp_path), tmp_path / "refused"
    monkeypatch.setattr(build, "_available_bytes", lambda device: 1000)
    size = (tiny_model_dir_hd64 / "model.safetensors").stat().st_size
    with pytest.raises(ValueError, match=whole(
            f"Q's model q8_0 and bfloat16 (with P's {tiny_model_dir_hd64}) needs about "
            f"{(2 * size + size // 2) / 2**20:.1f} MiB for the weights, more than the 0.0 MiB "
            f"free on cpu; free memory or use a smaller model")):
        kvdrift.measure(str(tiny_model_dir_hd64), ["full@int8", "full@bfloat16"], docs, out,
                        replicates=2, horizon=4, device="cpu")
    assert not out.exists()
    monkeypatch.undo()
    remote = tmp_path / "remote"
    shutil.copytree(tiny_model_dir_hd64, remote)
    config = json.loads((remote / "config.json").read_text())
    config |= {"model_type": "kvdrift-unknown", "auto_map": {"AutoConfig": "mine.Config"}}
    (remote / "config.json").write_text(json.dumps(config))
    own_code = f"^action 'full@{re.escape(str(remote))}': .*its own Python code"
    with pytest.raises(ValueError, match=own_code):
        kvdrift.measure(str(tiny_model_dir_hd64), [f"full@{remote}"], docs, out, replicates=2,
                        horizon=4, device="cpu")
    assert not out.exists()


def test_p_may_carry_a_model_part_too(tmp_path, tiny_model_dir_hd64):
    """``--model NAME@PART``: P's checkpoint loads, then its part applies (here its weights as
    Q8_0); the records carry the name, the fingerprint the digest of the quantized weights;
    another checkpoint as P's part is refused in one line, nothing written."""
    import kvdrift
    from kvdrift.lm.generators.build import load_side_model
    from kvdrift.lm.loading.digest import weights_digest
    from kvdrift.lm.loading.model import load_model

    name = f"{tiny_model_dir_hd64}@q8_0"
    p = load_side_model(name)
    plain = load_model(str(tiny_model_dir_hd64))
    quantize_weights(plain.model, "q8_0")
    assert weights_digest(p.model) == weights_digest(plain.model) and p.name == name
    out = tmp_path / "run"
    m = kvdrift.measure(name, ["full", "full@bfloat16"], _docs(tmp_path), out, replicates=2,
                        horizon=4, bootstrap=0, device="cpu")
    assert set(m.records.replicates["model"]) == {name}
    fingerprint = json.loads(pq.read_schema(next((out / "replicates").glob("*.parquet")))
                             .metadata[FINGERPRINT_KEY])
    assert fingerprint["weights_sha256"] == weights_digest(plain.model)
    with pytest.raises(ValueError, match=whole(
            f"model '{tiny_model_dir_hd64}@./other': P's checkpoint is the name before '@'; its "
            f"'@' part takes a weight type, a dtype or an attention, not another model "
            f"('./other')")):
        kvdrift.measure(f"{tiny_model_dir_hd64}@./other", ["full"], _docs(tmp_path),
                        tmp_path / "refused", replicates=2, horizon=4)
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_smollm2_sampled_tvs_equal_an_independent_replay(embedded_smollm2):
    """The embedded SmolLM2 against its int4 copy at temperature 1: every recorded TV,
    fixed-history TV, KL and log-probability equals a plain forward of each model over prompt
    + path, to 1e-4."""
    from kvdrift.lm.loading.model import encode_prompt

    lm = embedded_smollm2
    ids = encode_prompt(lm.tokenizer, "Name three rivers of Europe and say one thing about "
                                      "each of them.")
    q = build_generator(lm, parse_model("int4")).loaded.model
    pair = two_models(lm.model, q, ids, "full@int4")
    K, H = 4, 32
    r = coupled_rollouts(pair, K, H, temperature=1.0, seed=5)
    assert (r.tau > 0).all()  # Q4_0 parts from P in every replicate here
    worst = 0.0
    for i in range(K):
        lp_x, lq_y, lq_x = (replay(lm.model, ids, r.x[i], 1.0), replay(q, ids, r.y[i], 1.0),
                            replay(q, ids, r.x[i], 1.0))
        live = ~torch.cat([torch.zeros(1, dtype=torch.bool), r.x_eos[i, :-1] | r.y_eos[i, :-1]])
        rows = torch.arange(H)
        for got, want in ((r.delta[i], 0.5 * (lp_x.exp() - lq_y.exp()).abs().sum(-1)),
                          (r.f[i], 0.5 * (lp_x.exp() - lq_x.exp()).abs().sum(-1)),
                          (r.kl[i], (lp_x.exp() * (lp_x - lq_x)).sum(-1)),
                          (r.logq_x[i], lq_x[rows, r.x[i]])):
            worst = max(worst, float((got[live] - want[live]).abs().max()))
    assert worst < 1e-4, worst


def test_a_question_after_the_context_on_two_models(tmp_path, tiny_model_dir_hd64):
    """kvpress's pipeline protocol with Q on another model: each side's context is
    compressed on its own model, then the question appended; at temperature 0 the side
    whose model equals P's (``full@float32``: a copy of P's weights) gives P's tokens."""
    import kvdrift

    path = tmp_path / "qa.jsonl"
    context = "The ledger of the mill lists wheat, barley and oats for every month. " * 6
    path.write_text(json.dumps({"id": "qa", "context": context,
                                "questions": ["What does the ledger list?",
                                              "For how long?"]}) + "\n")
    m = kvdrift.measure(str(tiny_model_dir_hd64), ["snapkv-half@int8", "full@float32"], path,
                        replicates=2, horizon=8, temperature=0.0, bootstrap=0, device="cpu")
    steps = m.records.steps
    same = steps[steps.action == "full@float32"]
    assert (same["x_token"] == same["y_token"]).all() and (same["delta"] < 1e-5).all()
    assert steps["doc_id"].nunique() == 2  # one unit per question
