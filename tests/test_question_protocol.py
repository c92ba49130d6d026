"""kvpress's own protocol: the context compressed, the question asked after it.

Q's greedy tokens must be exactly what ``KVPressTextGenerationPipeline`` answers with the same
press (named actions, press objects, several questions over one context), P's what it answers
without a press; the whole-prompt protocol stays where no split is given.
"""

from __future__ import annotations

import json

import kvpress
import pytest
import torch

from kvdrift.data.document import CONTEXT_THEN_QUESTION, WHOLE_PROMPT, Document, DocumentError
from kvdrift.data.loaders import load_jsonl, write_jsonl

CONTEXT = ("The archive keeps three keys. The red key opens the north door, the blue key "
           "opens the cellar and the green key opens nothing at all. ") * 6
QUESTIONS = ("Which key opens the cellar?", "What does the green key open?")
HORIZON = 10


def _write(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# --- documents -------------------------------------------------------------------------------

def test_jsonl_splits_context_and_question(tmp_path):
    path = _write(tmp_path / "d.jsonl",
                  {"id": "a", "context": "ctx", "question": "q?", "answer": "x"},
                  {"id": "b", "context": "ctx2"},
                  {"id": "c", "context": "ctx3", "questions": ["q1", {"question": "q2",
                                                                     "answer": "y"}]},
                  {"id": "d", "prompt": "whole"})
    docs = load_jsonl(path)
    assert [(d.id, d.prompt, d.question, d.answer) for d in docs] == [
        ("a", "ctx", "q?", "x"), ("b", "ctx2", "", None), ("c:q1", "ctx3", "q1", None),
        ("c:q2", "ctx3", "q2", "y"), ("d", "whole", None, None)]
    assert [d.meta for d in docs[2:4]] == [{"context_id": "c", "question_index": 1},
                                           {"context_id": "c", "question_index": 2}]
    assert [d.protocol for d in docs] == [CONTEXT_THEN_QUESTION] * 4 + [WHOLE_PROMPT]
    write_jsonl(docs, tmp_path / "back.jsonl")
    assert load_jsonl(tmp_path / "back.jsonl") == docs


@pytest.mark.parametrize("record, message", [
    ({"id": "a", "prompt": "p", "question": "q"}, "either 'prompt'"),
    ({"id": "a", "prompt": "p", "context": "c"}, "either 'prompt'"),
    ({"id": "a"}, "missing key 'prompt' (or 'context' and 'question')"),
    ({"id": "a", "context": "c", "question": 3}, "key 'question' must be a string"),
    ({"id": "a", "context": " "}, "key 'context' must be a non-empty string"),
    ({"id": "a", "context": "c", "questions": []}, "non-empty list of questions"),
    ({"id": "a", "context": "c", "questions": [{"q": 1}]}, "question 1 must be a string"),
    ({"id": "a", "context": "c", "questions": ["q"], "answer": "x"},
     "give 'answer' inside each question's object"),
    ({"id": "a", "prompt": "c", "questions": ["q"]}, "'questions' goes with 'context'"),
])
def test_jsonl_split_mistakes_are_named(tmp_path, record, message):
    path = _write(tmp_path / "d.jsonl", record)
    with pytest.raises(DocumentError, match=None) as info:
        load_jsonl(path)
    assert message in str(info.value) and f"{path}:1" in str(info.value)


@pytest.mark.parametrize("family", ["niah_single", "niah_multiquery", "vt", "cwe", "fwe"])
def test_generated_tasks_split_at_their_question(family):
    """A generated task's natural split: the same text, cut where its question starts."""
    from kvdrift.data.ruler import make_document
    from kvdrift.data.sources import RulerSource, source_from_table

    def count(text):
        return len(text.split())

    whole = make_document(family, 600, count, seed=3)
    split = make_document(family, 600, count, seed=3, question_after=True)
    assert whole.question is None and split.question.startswith("\n\n")
    assert split.prompt + split.question == whole.prompt
    assert "?" in split.question or "answer" in split.question.lower()
    assert (split.id, split.answer, split.meta) == (whole.id, whole.answer, whole.meta)
    source = source_from_table({"source": "ruler", "question_after": True})
    assert isinstance(source, RulerSource) and source.protocol == CONTEXT_THEN_QUESTION
    assert source_from_table({"source": "ruler"}).protocol == WHOLE_PROMPT


def test_question_changes_the_fingerprint_only_where_given():
    from kvdrift.run.runner import RunConfig

    run = RunConfig(model="m", actions=("full",), replicates=1, horizon=2)
    whole = run.fingerprint(Document("a", "ctx"))
    split = run.fingerprint(Document("a", "ctx", question="q"))
    assert "protocol" not in whole and split["protocol"] == CONTEXT_THEN_QUESTION
    assert whole["prompt_sha256"] != split["prompt_sha256"]
    assert split["prompt_sha256"] != run.fingerprint(Document("a", "ctx",
                                                              question="r"))["prompt_sha256"]


# --- the engine against kvpress's pipeline ------------------------------------------------------

@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    from kvdrift.lm.loading.model import load_model

    return load_model(str(tiny_model_dir))


def _pipeline_tokens(loaded, press, questions, context=CONTEXT):
    """kvpress's pipeline answers, as token ids (its decoded text encoded back is not
    unique, so the pipeline's own generated ids are captured). A press that reads attention
    weights runs on the model switched to eager attention, as kvpress asks of its users."""
    from kvdrift.lm.actions.attention_use import needs_eager
    from kvdrift.lm.engine.shared_attention import attention_implementation

    pipe = kvpress.KVPressTextGenerationPipeline(model=loaded.model, tokenizer=loaded.tokenizer)
    captured = []
    decode = loaded.tokenizer.decode

    def capture(ids, **kwargs):
        captured.append([int(i) for i in ids])
        return decode(ids, **kwargs)

    loaded.tokenizer.decode = capture
    try:
        with attention_implementation(loaded.model, "eager" if needs_eager(press) else None):
            pipe(context, questions=list(questions), press=press,
                 max_new_tokens=HORIZON)
    finally:
        del loaded.tokenizer.decode
    return captured


def greedy_until_eos(pair, side="q", rewind=True, horizon=HORIZON):
    """A side's greedy tokens up to and including EOS (at most ``horizon``), its row kept
    whole and masked (``rewind``) or holding only what a decoding press keeps."""
    state, tokens = pair.start(side, 1, rewind=rewind), []
    for _ in range(horizon):
        token = pair.logprobs(state).argmax(-1)
        tokens.append(int(token))
        if tokens[-1] == pair.eos_token_id:
            break
        state = pair.advance(state, token)
    return tokens


# head-adaptive presses (adakv-*) are checked on SmolLM2 (slow lane): on the random tiny model
# kvpress's own pipeline cannot hide entries (its fake-key search fails for these queries);
# per-layer budgets (pyramidkv) are not here: the pipeline's question forward fails on them
# (transformers builds one mask for all layers; docs/method.md)
ACTIONS = ("snapkv-half", "recent-half", "knorm:ratio=0.5", "observed_attention:ratio=0.5")


@pytest.mark.parametrize("action", ACTIONS)
def test_named_action_answers_as_kvpress_pipeline(loaded, action):
    from kvdrift.lm.actions.spec import parse_action
    from kvdrift.lm.factory import LMPairFactory

    factory = LMPairFactory(loaded)
    docs = [Document(f"d:q{i}", CONTEXT, question=q) for i, q in enumerate(QUESTIONS)]
    press = parse_action(action).make_press(int(factory._split(docs[0])[0].shape[1]))
    wanted = _pipeline_tokens(loaded, press, QUESTIONS)
    reference = _pipeline_tokens(loaded, None, QUESTIONS)
    for doc, q_tokens, p_tokens in zip(docs, wanted, reference, strict=True):
        pair = factory(doc, action)
        assert greedy_until_eos(pair, "q") == q_tokens
        assert greedy_until_eos(pair, "p") == p_tokens
    assert factory.prefills <= 2  # one compression for both questions (eager: its own)


def test_press_object_answers_as_kvpress_pipeline(loaded):
    from kvdrift.lm.factory import LMPairFactory

    press = kvpress.ExpectedAttentionPress(compression_ratio=0.5)
    factory = LMPairFactory(loaded, presses={"mine": press})
    wanted = _pipeline_tokens(loaded, press, QUESTIONS)
    for i, (question, tokens) in enumerate(zip(QUESTIONS, wanted, strict=True)):
        pair = factory(Document(f"d:q{i}", CONTEXT, question=question), "mine")
        assert greedy_until_eos(pair, "q") == tokens
    assert factory.prefills == 2  # P's context once, the press's once: shared by the questions


def test_question_appended_to_full_cache_is_the_whole_prefill(loaded):
    """P's side: the context's cache plus the question equals one prefill of both, entry for
    entry; an action that evicts nothing gives Q = P by construction."""
    from kvdrift.lm.engine.prefill import prefill
    from kvdrift.lm.engine.question import append_question
    from kvdrift.lm.factory import LMPairFactory

    factory = LMPairFactory(loaded)
    doc = Document("d", CONTEXT, question=QUESTIONS[0])
    context, question = factory._split(doc)
    appended = append_question(loaded.model, prefill(loaded.model, context), question)
    whole = prefill(loaded.model, torch.cat([context, question], 1))
    assert appended.n_prompt == whole.n_prompt == context.shape[1] + question.shape[1]
    for a, b in zip(appended.keys + appended.values, whole.keys + whole.values, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    torch.testing.assert_close(appended.logits, whole.logits, rtol=0, atol=1e-4)
    pair = factory(doc, "full")
    assert pair.q_is_p


def test_q_keeps_its_own_first_distribution(loaded):
    """The question is read over the compressed context: Q's first logits are its own
    (delta_1 > 0 is possible), and Q stores the kept context entries plus every question
    entry."""
    from kvdrift.lm.factory import LMPairFactory

    factory = LMPairFactory(loaded)
    doc = Document("d", CONTEXT, question=QUESTIONS[0])
    context, question = factory._split(doc)
    pair = factory(doc, "snapkv-half")
    p, q = pair.prompt_cache("p"), pair.prompt_cache("q")
    assert q.kept == context.shape[1] // 2 + question.shape[1]
    assert p.kept == context.shape[1] + question.shape[1]
    assert not torch.equal(p.logits, q.logits)


def test_a_run_measures_and_names_the_protocol(tiny_model_dir, loaded, tmp_path):
    """End to end: a JSONL with two questions over one context, stored; Y at temperature 0 is
    kvpress's answer, run.json and the report name the protocol, the store records the
    question and the ids as the model saw them (context, then question)."""
    import kvdrift
    from kvdrift.lm.actions.spec import parse_action
    from kvdrift.lm.factory import LMPairFactory
    from kvdrift.report.sections.run import what_was_run
    from kvdrift.run.documents import read_documents

    docs = _write(tmp_path / "d.jsonl", {"id": "d", "context": CONTEXT,
                                         "questions": list(QUESTIONS)})
    out = tmp_path / "run"
    result = kvdrift.measure(str(tiny_model_dir), ("snapkv-half",), docs, out, bootstrap=0,
                             replicates=1, horizon=HORIZON, temperature=0)
    factory = LMPairFactory(loaded)
    first = Document("d:q1", CONTEXT, question=QUESTIONS[0],
                     meta={"context_id": "d", "question_index": 1})
    n_context = int(factory._split(first)[0].shape[1])
    wanted = _pipeline_tokens(loaded, parse_action("snapkv-half").make_press(n_context),
                              QUESTIONS)
    steps = result.records.steps.sort_values("t")
    for i, tokens in enumerate(wanted, 1):
        y = steps[steps.doc_id == f"d:q{i}"].y_token.tolist()
        assert y[:len(tokens)] == tokens
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["protocol"] == [CONTEXT_THEN_QUESTION]
    assert "appended uncompressed" in str(what_was_run(result.analysis))
    recorded = read_documents(out)
    found = recorded[(str(tiny_model_dir), "d:q1")]
    assert found.document == first
    assert list(found.prompt_ids) == torch.cat(factory._split(first), 1)[0].tolist()


# --- SmolLM2 (slow lane) -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_loaded(embedded_smollm2):
    return embedded_smollm2


SMOLLM2_CONTEXT = ("Rivers carve valleys over millennia; glaciers widen them, and the sea floods "
                   "their mouths when the ice melts. ") * 8
SMOLLM2_QUESTIONS = ("Explain how a fjord forms.", "What widens a valley?")


@pytest.fixture(scope="module")
def smollm2_pipeline_without_press(smollm2_loaded):
    """kvpress's pipeline's answers without a press: P's reference, the same for every action."""
    return _pipeline_tokens(smollm2_loaded, None, SMOLLM2_QUESTIONS, SMOLLM2_CONTEXT)


@pytest.mark.slow
@pytest.mark.parametrize("action", ["snapkv-half", "recent-half", "adakv-snapkv:ratio=0.5",
                                    "expected_attention:ratio=0.5", "mine"])
def test_smollm2_answers_as_kvpress_pipeline(smollm2_loaded, smollm2_pipeline_without_press,
                                             action):
    """On SmolLM2, Q's greedy answer to each of two questions over one compressed context
    is kvpress's pipeline's, token for token: named actions (head-adaptive included) and a
    press object; P's is the pipeline's without a press."""
    from kvdrift.lm.actions.spec import parse_action
    from kvdrift.lm.factory import LMPairFactory

    mine = kvpress.KnormPress(compression_ratio=0.6)
    factory = LMPairFactory(smollm2_loaded, presses={"mine": mine})
    docs = [Document(f"s:q{i}", SMOLLM2_CONTEXT, question=q)
            for i, q in enumerate(SMOLLM2_QUESTIONS)]
    n_context = int(factory._split(docs[0])[0].shape[1])
    press = mine if action == "mine" else parse_action(action).make_press(n_context)
    wanted = _pipeline_tokens(smollm2_loaded, press, SMOLLM2_QUESTIONS, SMOLLM2_CONTEXT)
    for doc, q_tokens, p_tokens in zip(docs, wanted, smollm2_pipeline_without_press,
                                       strict=True):
        pair = factory(doc, action)
        assert greedy_until_eos(pair, "q") == q_tokens
        assert greedy_until_eos(pair, "p") == p_tokens


def test_run_json_names_the_protocols_a_study_uses(tmp_path):
    """``protocol`` is recorded where a document (or a generator) asks its question after the
    context, both protocols where a study mixes them, nothing where all are whole."""
    from kvdrift.study import fixed_documents, protocol_record
    from kvdrift.study_config import parse_study

    split = _write(tmp_path / "split.jsonl", {"id": "a", "context": "c", "question": "q"})
    whole = _write(tmp_path / "whole.jsonl", {"id": "b", "prompt": "p"})

    def record(*tables):
        config = parse_study({"study": {"models": ["smollm2"], "actions": ["full"]},
                              "documents": list(tables)})
        return protocol_record(config, fixed_documents(config))

    jsonl = {"source": "jsonl", "path": str(whole)}
    assert record(jsonl) == {}
    assert record({"source": "ruler"}) == {}
    assert record({"source": "ruler", "question_after": True}) == {
        "protocol": [CONTEXT_THEN_QUESTION]}
    assert record(jsonl, {"source": "jsonl", "path": str(split)}) == {
        "protocol": [CONTEXT_THEN_QUESTION, WHOLE_PROMPT]}


def test_kvdrift_run_names_the_protocol(tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from kvdrift.cli import app

    docs = _write(tmp_path / "d.jsonl", {"id": "a", "context": CONTEXT, "question": "Who?"})
    result = CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir), "--docs",
                                      str(docs), "--actions", "snapkv-half,decoding-knorm:"
                                      "interval=4,target=64", "--replicates", "2",
                                      "--horizon", "3", "--out", str(tmp_path / "run")])
    assert result.exit_code != 0  # a decode-time press on a question: refused in one line,
    assert not (tmp_path / "run" / "run.json").exists()  # before anything is written
    assert "action 'decoding-knorm:interval=4,target=64' compresses during decoding; over a " \
        "question kvdrift measures only kvpress's DecodingPress" in " ".join(
            result.output.split())
    result = CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir), "--docs",
                                      str(docs), "--actions", "snapkv-half", "--replicates",
                                      "2", "--horizon", "3", "--out", str(tmp_path / "run2")])
    assert result.exit_code == 0, result.output
    assert "protocol: context compressed, then the question and the chat template's tail " \
        "appended uncompressed for P and Q (kvpress's pipeline)" in " ".join(
            result.output.split())


def test_a_dataset_with_context_and_question_columns(tmp_path):
    """kvpress's benchmark datasets hold ``context`` and ``question`` columns: with
    ``question_field`` the prompt field is the context and the question follows it."""
    datasets = pytest.importorskip("datasets")
    from kvdrift.data.sources import source_from_table

    saved = tmp_path / "saved"
    datasets.DatasetDict({"test": datasets.Dataset.from_list([
        {"context": "A long text.", "question": "What?", "answers": ["x"]},
        {"context": "Another text.", "question": None, "answers": ["y"]}])}).save_to_disk(
        str(saved))
    source = source_from_table({"source": "hf", "name": str(saved), "split": "test",
                                "prompt_field": "context", "question_field": "question",
                                "answer_field": "answers"})
    docs = source.documents()
    assert [(d.prompt, d.question, d.answer) for d in docs] == [
        ("A long text.", "What?", "x"), ("Another text.", "", "y")]
    assert source.as_dict()["question_field"] == "question"
    whole = source_from_table({"source": "hf", "name": str(saved), "split": "test",
                               "prompt_field": "context"})
    assert [d.question for d in whole.documents()] == [None, None]
