"""The llama.cpp engine: its grammar, exactness against llama.cpp's own generation, the
sequences that share a prompt, sampled TVs against an independent recomputation, studies,
refusals and requantized copies (docs/llama-cpp.md)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from kvdrift.llamacpp.binding import available
from kvdrift.llamacpp.cache_types import LlamaAction, parse_llama_action

needs_llama = pytest.mark.skipif(not available(), reason="llama-cpp-python is not installed")

LONG = "Write a long story about a robot who learns to paint, with many chapters."


@pytest.mark.parametrize("spec,want", [
    ("full", LlamaAction("full")),
    ("gguf:k=q8_0,v=q4_0", LlamaAction("gguf:k=q8_0,v=q4_0", "q8_0", "q4_0")),
    ("gguf:k=q4_0,v=f16,fa=off", LlamaAction("gguf:k=q4_0,v=f16,fa=off", "q4_0", "f16", False)),
    ("gguf:k=iq4_nl", LlamaAction("gguf:k=iq4_nl", "iq4_nl", "f16")),
    ("full@Q4_K_M", LlamaAction("full@Q4_K_M", model="Q4_K_M")),
    ("full@q8_0", LlamaAction("full@q8_0", model="q8_0")),
    ("gguf:k=q8_0,v=q8_0@./x.gguf", LlamaAction("gguf:k=q8_0,v=q8_0@./x.gguf", "q8_0", "q8_0",
                                                model="./x.gguf")),
])
def test_actions_parse(spec, want):
    assert parse_llama_action(spec) == want


@pytest.mark.parametrize("spec,words", [
    ("snapkv-half", "not a llama.cpp action"),
    ("gguf:k=q3_0", "k='q3_0' is not a llama.cpp cache type"),
    ("gguf:k=q8_0,v=q4_0,fa=off", "only with flash attention"),
    ("gguf:k=q8_0,fa=maybe", "fa='maybe'"),
    ("gguf:k=q8_0,w=2", "unknown field 'w'"),
    ("full@", "after '@'"),
    ("full@Q9_9", "a .gguf file or a llama.cpp weight type"),
    ("gguf:k=q8_0,k=q4_0", "given once"),
])
def test_bad_actions_refused_in_one_line(spec, words):
    with pytest.raises(ValueError) as err:
        parse_llama_action(spec)
    assert words in str(err.value) and "\n" not in str(err.value)


# ---- against llama.cpp itself ---------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    from kvdrift.lm.loading.model import load_tokenizer

    return load_tokenizer("smollm2")


def _factory(tokenizer, horizon, rows=2):
    from kvdrift.llamacpp.factory import LlamaCppFactory

    return LlamaCppFactory("smollm2", tokenizer, horizon=horizon, rows=rows)


def _llama(action: LlamaAction, n_ctx=1024):
    """llama.cpp's own high-level model object with the action's cache settings."""
    import llama_cpp

    from kvdrift.llamacpp.files import model_file

    return llama_cpp.Llama(
        model_path=str(model_file("smollm2")), n_ctx=n_ctx, verbose=False, logits_all=True,
        flash_attn=action.flash_attention, n_threads=2,
        type_k=getattr(llama_cpp, f"GGML_TYPE_{action.type_k.upper()}"),
        type_v=getattr(llama_cpp, f"GGML_TYPE_{action.type_v.upper()}"))


@needs_llama
@pytest.mark.slow
@pytest.mark.parametrize("spec", ["full", "gguf:k=q8_0,v=q4_0", "gguf:k=q4_0,v=f16,fa=off"])
def test_greedy_rows_equal_llama_cpp_generate_over_256_positions(tokenizer, spec):
    """P's and Q's greedy rows are llama.cpp's own greedy generation with the same cache
    settings, token for token, and every log-probability is its logits' (bit for bit)."""
    from kvdrift.data.document import Document

    H = 256
    factory = _factory(tokenizer, H)
    doc = Document(id="story", prompt=LONG)
    pair = factory(doc, spec)
    prompt = [int(t) for t in factory.prompt_ids(doc).reshape(-1)]
    for side, action in (("p", LlamaAction("full")), ("q", parse_llama_action(spec))):
        state, tokens, rows = pair.start(side, 2), [], []
        for t in range(H):
            logp = pair.logprobs(state)
            assert torch.equal(logp[0], logp[1])  # two rows on one history: one answer
            token = logp.argmax(-1)
            tokens.append(int(token[0]))
            rows.append(logp[0])
            if t < H - 1:
                (state,) = pair.advance_many([state], [token])
        llm = _llama(action)
        theirs = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            theirs.append(int(token))
            if len(theirs) == H or token == tokenizer.eos_token_id:
                break
        n = len(theirs)
        assert tokens[:n] == theirs, (side, spec)
        scores = torch.from_numpy(np.asarray(llm.scores[len(prompt) - 1:len(prompt) - 1 + n],
                                             dtype=np.float64))
        assert torch.equal(torch.stack(rows[:n]), torch.log_softmax(scores, dim=-1))
        del llm


def _straight(tokenizer, prompt, history, action: LlamaAction) -> torch.Tensor:
    """Log-probabilities after ``history`` from a fresh single-sequence llama.cpp context."""
    llm = _straight.cache.get(action)
    if llm is None:
        llm = _straight.cache[action] = _llama(action)
    llm.reset()
    llm.eval(list(prompt))
    for token in history:  # one token per decode, as llama.cpp's own generation runs
        llm.eval([int(token)])
    logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    return torch.log_softmax(torch.from_numpy(logits), dim=-1)


_straight.cache = {}


def _along(prompt, path, action: LlamaAction) -> torch.Tensor:
    """``[len(path), vocab]`` log-probabilities before each token of ``path`` from a fresh
    llama.cpp context, one token per decode."""
    llm = _straight.cache.get(action)
    if llm is None:
        llm = _straight.cache[action] = _llama(action)
    llm.reset()
    llm.eval(list(prompt))
    for token in path[:-1]:
        llm.eval([int(token)])
    rows = np.asarray(llm.scores[len(prompt) - 1:len(prompt) - 1 + len(path)], dtype=np.float64)
    return torch.log_softmax(torch.from_numpy(rows), dim=-1)


@needs_llama
def test_branching_rows_read_what_a_fresh_sequence_reads(tokenizer):
    """Rows made by select (with repeats), truncate, join and advance, in any order, give the
    log-probabilities a fresh llama.cpp sequence gives their history, though they share and
    take over one another's sequences (six sequences for up to six histories)."""
    from kvdrift.data.document import Document

    factory = _factory(tokenizer, horizon=12, rows=1)
    factory.slots = 6  # few sequences: rows must take them over, and copy shared prefixes
    doc = Document(id="branch", prompt="Name three colours.")
    pair = factory(doc, "gguf:k=q8_0,v=q4_0")
    prompt = [int(t) for t in factory.prompt_ids(doc).reshape(-1)]
    action = parse_llama_action("gguf:k=q8_0,v=q4_0")
    rng = np.random.default_rng(0)
    state = pair.start("q", 3)
    for step in range(16):
        kind = step % 4
        if kind == 0:
            tokens = torch.as_tensor(rng.integers(0, 500, len(state)))
            if max(len(h) for h in state.histories) < 11:
                (state,) = pair.advance_many([state], [tokens])
        elif kind == 1:
            rows = torch.as_tensor(rng.integers(0, len(state), 3))
            state = pair.select(state, rows)
        elif kind == 2:
            lengths = torch.as_tensor([rng.integers(0, len(h) + 1) for h in state.histories])
            state = pair.truncate(state, lengths)
        else:
            state = pair.join([state, pair.select(state, torch.tensor([0]))])
            state = pair.select(state, torch.tensor([0, len(state) - 1, 1]))
        got = pair.logprobs(state)
        for i, h in enumerate(state.histories):
            assert torch.equal(got[i], _straight(tokenizer, prompt, h, action)), (step, h)


@needs_llama
def test_sampled_tvs_equal_a_recomputation_from_llama_cpp_logits(tokenizer):
    """Coupled rollouts at temperature 1: each recorded TV is the TV of llama.cpp's own
    distributions (fresh contexts) along the recorded paths, and each row's tokens are a
    path those distributions allow."""
    from kvdrift.coupling import tempered_probs, tv_distance
    from kvdrift.data.document import Document
    from kvdrift.estimate.rollout import coupled_rollouts

    H = 16
    factory = _factory(tokenizer, H, rows=3)
    doc = Document(id="tv", prompt="Describe the sea in one paragraph.")
    pair = factory(doc, "gguf:k=q4_0,v=q4_0")
    r = coupled_rollouts(pair, 3, H, temperature=1.0, seed=5)
    prompt = [int(t) for t in factory.prompt_ids(doc).reshape(-1)]
    worst = 0.0
    for k in range(3):
        n = H if not bool(r.x_eos[k].any()) else int(r.x_eos[k].long().argmax()) + 1
        p = tempered_probs(_along(prompt, r.x[k, :n].tolist(), LlamaAction("full")), 1.0)
        q = tempered_probs(_along(prompt, r.y[k, :n].tolist(),
                                  parse_llama_action("gguf:k=q4_0,v=q4_0")), 1.0)
        worst = max(worst, float((tv_distance(p, q) - r.delta[k, :n]).abs().max()))
        assert (p[torch.arange(n), r.x[k, :n]] > 0).all()
        assert (q[torch.arange(n), r.y[k, :n]] > 0).all()
    assert worst <= 1e-12, worst
