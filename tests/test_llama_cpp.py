"""The llama.cpp engine: its grammar, exactness against llama.cpp's own generation, the
sequences that share a prompt, sampled TVs against an independent recomputation, studies,
refusals and requantized copies (docs/llama-cpp.md)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from kvdrift.llamacpp.binding import available
from kvdrift.llamacpp.cache_types import (
    BLOCKED,
    GGML_TYPE_IDS,
    LlamaAction,
    parse_llama_action,
)

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
        type_k=GGML_TYPE_IDS[action.type_k], type_v=GGML_TYPE_IDS[action.type_v])


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
    for step in range(32):
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
        if kind:  # rows truncated, selected and joined reach the next advance unread, as
            continue  # in SWRB: the advance's decode meets sequences that hold other tokens
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


# ---- studies: records, resume, refusals -----------------------------------------------

def _cli(*args):
    from typer.testing import CliRunner

    from kvdrift.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def _docs(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "prompt": "Name three rivers."}\n'
                    '{"id": "b", "context": "The sea is blue.", "question": "What colour?"}\n')
    return path


@needs_llama
def test_run_inside_llama_cpp_records_the_engine_and_refuses_a_changed_q_file(tmp_path):
    import json

    import pyarrow.parquet as pq

    from kvdrift.llamacpp.files import model_file

    q_file = tmp_path / "q.gguf"
    shutil.copyfile(model_file("smollm2"), q_file)
    docs, out = _docs(tmp_path), tmp_path / "run"
    actions = f"full,gguf:k=q4_0,v=q4_0,full@{q_file}"
    args = ["run", "--engine", "llama.cpp", "--actions", actions, "--docs", docs,
            "--replicates", 2, "--horizon", 6, "--out", out]
    result = _cli(*args)
    assert result.exit_code == 0, result.output
    prints = {}
    for path in (out / "replicates").glob("*.parquet"):
        meta = pq.read_schema(path).metadata
        prints[json.loads(meta[b"kvdrift.unit"])[2]] = json.loads(meta[b"kvdrift.fingerprint"])
    assert set(prints) == {"full", "gguf:k=q4_0,v=q4_0", f"full@{q_file}"}
    assert all(p["engine"].startswith("llama.cpp (llama-cpp-python 0.3.36") for p in
               prints.values())
    assert prints[f"full@{q_file}"]["q_model"]["file_sha256"] == \
        prints["full"]["weights_sha256"]  # the same bytes as P's file
    reps = pq.read_table(out / "replicates").to_pandas()
    # the same bytes, the full cache: Q is P, row for row; q4_0 caches hold 9/32 of f16's
    same = reps[reps.action == f"full@{q_file}"]
    assert (same["tau"] == 0).all() and (same["kv_fraction"] == 1.0).all()
    assert (same["weights_fraction"] == 1.0).all()  # Q's file is as large as P's
    assert (same["weights_bytes"] == q_file.stat().st_size).all()
    assert (reps[reps.action == "gguf:k=q4_0,v=q4_0"]["kv_fraction"] == 9 / 32).all()
    with open(q_file, "r+b") as handle:  # one byte of Q's weights changes
        handle.seek(-100, 2)
        byte = handle.read(1)
        handle.seek(-100, 2)
        handle.write(bytes([byte[0] ^ 1]))
    result = _cli(*args)
    assert result.exit_code != 0
    assert "its Q model has changed since it was stored (file_sha256" in result.output


def _fake_gguf(path, tokens, head_dim=64):
    """A GGUF file with a model's metadata and a vocabulary, and one small tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_embedding_length(head_dim * 2)
    writer.add_head_count(2)
    writer.add_context_length(64)
    writer.add_token_list(tokens)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@needs_llama
def test_bad_files_and_settings_are_refused_in_one_line_with_nothing_written(tmp_path):
    from kvdrift.llamacpp.files import model_file, read_info

    tokens = list(read_info(model_file("smollm2")).tokens)
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("hello")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(model_file("smollm2").read_bytes()[:5_000_000])
    other = _fake_gguf(tmp_path / "other.gguf", ["<a>", "<b>"] + tokens[2:])
    docs = _docs(tmp_path)
    cases = [
        (["--actions", f"full@{not_gguf}"], "is not a GGUF file (it starts with b'hell'"),
        (["--actions", f"full@{truncated}"], "truncated"),
        (["--actions", f"full@{other}"], "has another vocabulary than P's model (token 0 is "
                                         "'<a>' there"),
        (["--actions", f"full@{tmp_path / 'none.gguf'}"], "does not exist"),
        (["--actions", "gguf:k=q4_0,v=q4_0,fa=off"], "only with flash attention"),
        (["--actions", "snapkv-half"], "is not a llama.cpp action"),
        (["--actions", "full", "--horizon", 8190], "context window of 8192 tokens"),
        (["--actions", "full", "--attribution"], "attribution reads transformers"),
        (["--actions", "full", "--model", not_gguf], "is not a GGUF file"),
    ]
    for extra, words in cases:
        out = tmp_path / "refused"
        result = _cli("run", "--engine", "llama.cpp", "--docs", docs, "--replicates", 2,
                      "--horizon", 4, "--out", out, *extra)
        assert result.exit_code != 0, extra
        assert words in result.output, (extra, result.output)
        assert not out.exists() or not any(out.iterdir()), extra
    narrow = _fake_gguf(tmp_path / "narrow.gguf", tokens, head_dim=48)
    result = _cli("run", "--engine", "llama.cpp", "--model", narrow, "--docs", docs,
                  "--actions", "gguf:k=q8_0,v=f16", "--replicates", 2, "--horizon", 4,
                  "--out", tmp_path / "narrow-run")
    assert "blocks of 32 along the head" in result.output


@needs_llama
def test_requantized_copy_is_made_once_with_its_digest_and_remade_when_changed(
        tmp_path, monkeypatch):
    from kvdrift.llamacpp.files import digest, model_file, quantized_copy, read_info

    monkeypatch.setenv("KVDRIFT_CACHE", str(tmp_path / "cache"))
    source = model_file("smollm2")
    copy = quantized_copy(source, "Q8_0")
    assert copy.parent == tmp_path / "cache" / "llama.cpp"
    assert copy.with_suffix(".sha256").read_text().strip() == digest(copy)
    assert read_info(copy).tokens == read_info(source).tokens
    assert copy.stat().st_size > 1.3 * source.stat().st_size  # 8.5 bits a weight, not 5
    made = copy.stat().st_mtime_ns
    assert quantized_copy(source, "Q8_0").stat().st_mtime_ns == made  # reused
    with open(copy, "r+b") as handle:
        handle.seek(-10, 2)
        handle.write(b"\0" * 4)
    again = quantized_copy(source, "Q8_0")
    assert again.with_suffix(".sha256").read_text().strip() == digest(again)


def test_kl_statistics_are_llama_perplexitys_definitions():
    """Mean with its standard error, percentiles (numpy's linear rule, as llama.cpp's
    sorted-array interpolation), max, min and the same-top share with sqrt(p(1-p)/n)."""
    import pandas as pd

    from kvdrift.analysis.kl_statistics import KL_PERCENTILES, kl_statistics

    kl = np.arange(101, dtype=float) / 100  # 0.00, 0.01, ..., 1.00
    top = (np.arange(101) % 4 != 0).astype(float)  # 75 of 101 agree... 76 = 101 - 26 + 1
    steps = pd.DataFrame({"action": ["a"] * 101 + ["b"] * 2,
                          "kl": np.concatenate([kl, [np.nan, 0.5]]),
                          "top1": np.concatenate([top, [1.0, 0.0]])})
    a, b = kl_statistics(steps)
    assert a.action == "a" and a.positions == 101
    assert a.mean == pytest.approx(0.5) and a.maximum == 1.0 and a.minimum == 0.0
    assert a.mean_se == pytest.approx(np.std(kl, ddof=1) / np.sqrt(101))
    assert list(a.percentiles) == list(KL_PERCENTILES)
    assert a.percentiles[50.0] == pytest.approx(0.5)
    assert a.percentiles[90.0] == pytest.approx(0.9) and a.percentiles[1.0] == pytest.approx(0.01)
    assert a.same_top == pytest.approx(75 / 101)
    assert a.same_top_se == pytest.approx(np.sqrt((75 / 101) * (26 / 101) / 101))
    assert b.positions == 1 and b.same_top == 0.0 and np.isnan(b.mean_se)  # NaN rows dropped


def test_gguf_weights_family_walks_llama_quants_by_bits_and_needs_the_engine():
    from kvdrift.frontier_search.families import (
        GGUF_WEIGHTS_FAMILY,
        check_engine_families,
        family_budgets,
        memory_column,
        parse_family,
    )
    from kvdrift.llamacpp.cache_types import WEIGHT_QUANTS

    family = parse_family(GGUF_WEIGHTS_FAMILY)
    bits = [WEIGHT_QUANTS[b.label] for b in family.budgets]
    assert bits == sorted(bits, reverse=True) and len(bits) == len(WEIGHT_QUANTS)
    assert family.budgets[0].action == "full@Q8_0" and family.budgets[-1].action == "full@Q2_K"
    assert [parse_llama_action(b.action).quantized_weights for b in family.budgets] == \
        [b.label for b in family.budgets]
    assert memory_column([family]) == "weights_fraction"
    with pytest.raises(ValueError, match="one frontier ranks one memory"):
        memory_column([family, parse_family("gguf")])
    assert family_budgets("gguf")  # the cache types: both engines
    check_engine_families(["gguf", GGUF_WEIGHTS_FAMILY], "llama.cpp")
    with pytest.raises(ValueError, match="the llama.cpp engine walks the families gguf, "
                                         "gguf-weights"):
        check_engine_families(["snapkv"], "llama.cpp")
    with pytest.raises(ValueError, match="add --engine llama.cpp"):
        check_engine_families([GGUF_WEIGHTS_FAMILY], "transformers")


EMULATED = ("gguf:k=q8_0,v=q8_0", "gguf:k=q8_0,v=q4_0", "gguf:k=q4_0,v=q4_0")


def _kl_along(pair, text: list[int]) -> float:
    """Mean KL(P || Q) over the positions of ``text`` (both sides teacher-forced on it)."""
    p, q = pair.start("p", 1), pair.start("q", 1)
    total = 0.0
    for t, token in enumerate(text):
        lp, lq = pair.logprobs(p), pair.logprobs(q)
        total += float((lp.exp() * (lp - lq)).sum())
        if t < len(text) - 1:
            p, q = pair.advance_many([p, q], [torch.tensor([token])] * 2)
    return total / len(text)


def emulation_against_engine(loaded, tokenizer, documents, horizon=32):
    """``{action: (KL inside llama.cpp, KL of the torch emulation)}``: the mean teacher-forced
    KL(P || Q) along the llama.cpp P's greedy text of each document, each engine's P and Q
    on the same token ids (what docs/llama-cpp.md's test holds within a bound)."""
    from kvdrift.lm.factory import LMPairFactory

    engine = _factory(tokenizer, horizon)
    emulation = LMPairFactory(loaded)
    out = {a: [0.0, 0.0] for a in EMULATED}
    for doc in documents:
        pair = engine(doc, "full")
        state, text = pair.start("p", 1), []
        for t in range(horizon):
            token = pair.logprobs(state).argmax(-1)
            text.append(int(token))
            if t < horizon - 1:
                (state,) = pair.advance_many([state], [token])
        for action in EMULATED:
            out[action][0] += _kl_along(engine(doc, action), text) / len(documents)
            out[action][1] += _kl_along(emulation(doc, action), text) / len(documents)
    return {a: tuple(v) for a, v in out.items()}


@needs_llama
@pytest.mark.slow
def test_torch_emulation_stays_within_stated_bounds_of_the_engine(embedded_smollm2, tokenizer):
    """Along the same texts, the mean KL(P || Q) of each emulated cache type is within a factor
    of 15 of llama.cpp's own (measured: 0.09 for q8_0, whose query llama.cpp quantizes too;
    0.75 and 2.4 for the others: docs/llama-cpp.md), and both engines order the types
    q8_0 < q8_0/q4_0 < q4_0."""
    from kvdrift.data.document import Document

    docs = [Document(id="story", prompt=LONG),
            Document(id="facts", prompt="List five facts about the moon, one per line.")]
    kl = emulation_against_engine(embedded_smollm2, tokenizer, docs)
    for action, (engine, emulated) in kl.items():
        assert 1 / 15 <= emulated / engine <= 15, (action, engine, emulated)
    for side in (0, 1):
        values = [kl[a][side] for a in EMULATED]
        assert values == sorted(values), (side, kl)


def test_without_the_binding_the_engine_says_how_to_install_it_in_one_line(tmp_path,
                                                                           monkeypatch):
    import sys

    from kvdrift.llamacpp import binding

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # importing it fails
    binding.llama.cache_clear()
    try:
        assert not binding.available()
        out = tmp_path / "run"
        result = _cli("run", "--engine", "llama.cpp", "--docs", _docs(tmp_path),
                      "--replicates", 2, "--horizon", 4, "--out", out)
        assert result.exit_code != 0
        assert "pip install llama-cpp-python==0.3.36" in result.output
        assert "Traceback" not in result.output and not out.exists()
    finally:
        binding.llama.cache_clear()


@needs_llama
@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1",
                                  "iq4_nl", "q4_0"])
def test_every_cache_type_llama_cpp_offers_runs(tokenizer, kind):
    """Each cache type for keys and values makes a context and steps rows; the f16 one is P's
    cache exactly (the same logits), the quantized ones are not."""
    from kvdrift.data.document import Document

    factory = _factory(tokenizer, horizon=3)
    pair = factory(Document(id="t", prompt="Say hello."), f"gguf:k={kind},v={kind}")
    p, q = pair.start("p", 2), pair.start("q", 2)
    for _ in range(2):
        lp, lq = pair.logprobs(p), pair.logprobs(q)
        assert torch.isfinite(lq).any(dim=-1).all()
        if kind == "f16" or kind in BLOCKED:
            assert torch.equal(lp, lq) == (kind == "f16")
        token = lp.argmax(-1)
        p, q = pair.advance_many([p, q], [token, token])
    factory.close()


@needs_llama
def test_measure_in_python_inside_llama_cpp_writes_nothing(tmp_path, monkeypatch):
    """``kvdrift.measure(engine="llama.cpp")`` without ``out``: the records in memory, nothing
    written; the same numbers as the same run stored in a folder."""
    import kvdrift

    monkeypatch.chdir(tmp_path)
    docs = _docs(tmp_path)
    kwargs = dict(replicates=2, horizon=5, bootstrap=0, engine="llama.cpp")
    m = kvdrift.measure("smollm2", ["gguf:k=q4_0,v=q4_0"], docs, **kwargs)
    assert m.out is None and sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]
    stored = kvdrift.measure("smollm2", ["gguf:k=q4_0,v=q4_0"], docs, tmp_path / "run", **kwargs)
    a, b = m.records.steps, stored.records.steps
    assert len(a) == len(b) > 0
    assert np.array_equal(a["delta"].to_numpy(), b["delta"].to_numpy())
    assert m.records.config["engine"] == "llama.cpp"


@needs_llama
def test_settings_llama_cpp_refuses_are_one_line_naming_the_action(tokenizer):
    """A combination llama.cpp itself refuses (here a quantized V cache without flash
    attention, which kvdrift's grammar refuses first; a build without flash attention is
    refused the same way) is one line naming the action, from the pre-flight context."""
    factory = _factory(tokenizer, horizon=4)
    try:
        factory.check_actions(["full", "gguf:k=q4_0,v=f16,fa=off"])  # offered: no error
        action = LlamaAction("gguf:k=q4_0,v=q4_0,fa=off", "q4_0", "q4_0", False)
        with pytest.raises(ValueError) as err:
            factory._context(factory.p_file, action, 256, 1)
        assert str(err.value).startswith("action 'gguf:k=q4_0,v=q4_0,fa=off': llama.cpp cannot "
                                         "make a context with k=q4_0, v=q4_0, fa=off")
    finally:
        factory.close()
