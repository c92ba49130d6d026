"""Issue 63 (2): a decoding-time or quantizing action on a document with a question (kvpress's
pipeline protocol) is refused in one line naming the action and the document, before torch
loads where it is a spec string and the documents are in a file, and before anything is
written where it is a press object."""

from __future__ import annotations

import json

import pytest

import kvdrift
from kvdrift.lm.grammar import after_context
from tests.test_hostile_refusals import fresh_cli
from tests.test_question_protocol import greedy_until_eos

HEAVY = ("torch", "transformers", "kvpress")
#: What the refusals say kvdrift measures instead.
MEASURED = ("over a question kvdrift measures only kvpress's DecodingPress with a target_size "
            "(alone or in a PrefillDecodingPress) given as a press object")
QUANTIZED = "kvdrift measures quantization on whole-prompt documents only"


def _cli(*args: str, cwd) -> tuple[int, list[str], str]:
    """Exit code, heavy modules loaded when it returned, and stderr of a fresh ``kvdrift``."""
    code, loaded, stderr, _ = fresh_cli(*args, cwd=cwd)
    return code, loaded, stderr


def _write(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _docs(tmp_path):
    """A file whose second document asks a question after its context."""
    return _write(tmp_path / "docs.jsonl", {"id": "whole", "prompt": "A prompt."},
                  {"id": "asks", "context": "The cat sat on the mat.", "question": "Where?"})


# --- spec strings, from their names alone -----------------------------------------------------

SPECS = [
    "full", "snapkv-half", "recent-90", "snapkv:ratio=0.5", "adakv-snapkv:ratio=0.5",
    "decoding-knorm:interval=4,target=16", "decoding-adakv-knorm:interval=4,target=16",
    "cam-knorm:interval=4,target=16", "decoding-knorm:interval=4,ratio=0.5",
    "snapkv:ratio=0.5+decoding-knorm:interval=4,target=16",
    "adakv-snapkv:ratio=0.5+decoding-adakv-knorm:interval=4,target=16",
    "snapkv:ratio=0.5+kivi:bits=4", "kivi:bits=2", "knorm:ratio=0.5+gguf:k=q8_0,v=q8_0",
    "fp8:e4m3", "snapkv:ratio=0.5+knorm:ratio=0.8", "full@int4",
    "decoding-knorm:interval=4,target=16@int4", "snapkv-half@q8_0",
]


@pytest.mark.parametrize("spec", SPECS)
def test_the_names_tell_decoding_and_quantization_as_the_parser_does(spec):
    from kvdrift.lm.actions.spec import parse_action

    action = parse_action(spec)
    assert after_context.spec_kinds(spec) == (action.decoding is not None,
                                              action.quantization is not None)


def test_the_decoding_families_are_the_press_library_s():
    from kvdrift.lm.actions.presses import FAMILIES

    assert after_context.DECODING_FAMILIES == tuple(
        f.name for f in FAMILIES.values() if f.is_decoding)


def test_a_press_of_the_user_s_is_left_to_its_object_and_its_quantizer_is_seen():
    assert after_context.spec_kinds("decoding-mine", defined={"decoding-mine"}) == (
        False, False)
    assert after_context.spec_kinds("mine+kivi:bits=4", defined={"mine"}) == (False, True)


# --- spec strings on the command line: before torch, nothing written --------------------------

@pytest.mark.parametrize("action, said", [
    ("decoding-knorm:interval=4,target=16", "compresses during decoding"),
    ("snapkv:ratio=0.5+cam-knorm:interval=4,target=16", "compresses during decoding"),
    ("snapkv:ratio=0.5+kivi:bits=4", "quantizes the cache"),
])
def test_kvdrift_run_refuses_before_torch_with_nothing_written(action, said, tmp_path):
    docs = _docs(tmp_path)
    code, loaded, stderr = _cli("run", "--actions", f"snapkv-half,{action}", "--docs",
                                str(docs), "--replicates", "1", "--horizon", "2", "--out",
                                "out", cwd=tmp_path)
    assert code == 2, stderr
    assert stderr.strip() == (
        f"error: action {action!r} {said}; "
        f"{MEASURED if 'decoding' in said else QUANTIZED}, and document 'asks' asks a "
        f"question after its context (give 'prompt', not 'context' and 'question')"), stderr
    assert loaded == [], f"{loaded} imported before the refusal"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]  # no output folder


def test_kvdrift_study_refuses_generated_questions_before_torch(tmp_path):
    (tmp_path / "s.toml").write_text(
        '[study]\nmodels = ["smollm2"]\nactions = ["snapkv-half", '
        '"decoding-knorm:interval=4,target=16"]\n'
        '[[documents]]\nsource = "ruler"\nquestion_after = true\n')
    code, loaded, stderr = _cli("study", "s.toml", "--out", "out", cwd=tmp_path)
    assert code == 2, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "every ruler document asks a question after its context (set question_after = " \
        "false)" in stderr, stderr
    assert loaded == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


def test_kvdrift_frontier_refuses_a_decoding_family_before_torch(tmp_path):
    docs = _docs(tmp_path)
    code, loaded, stderr = _cli("frontier", "--families", "snapkv,decoding-knorm", "--docs",
                                str(docs), "--out", "fr", cwd=tmp_path)
    assert code == 2, stderr
    assert stderr.strip() == (
        f"error: family 'decoding-knorm' compresses during decoding; {MEASURED}, and "
        f"document 'asks' asks a question after its context (give 'prompt', not 'context' "
        f"and 'question')"), stderr
    assert loaded == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


def test_a_dataset_with_a_question_field_is_refused_before_it_loads(tmp_path):
    from kvdrift.study_config import parse_study

    table = {"source": "hf", "name": str(tmp_path / "absent"), "split": "test",
             "prompt_field": "context", "question_field": "question"}
    with pytest.raises(ValueError, match="every document of dataset .*absent' asks a "
                       r"question after its context \(drop question_field = 'question'\)"):
        parse_study({"study": {"models": ["smollm2"], "actions": ["kivi:bits=4"]},
                     "documents": [table]}, read_documents=True)


def test_prefill_actions_and_whole_prompts_are_not_refused(tmp_path):
    from kvdrift.study_config import parse_study

    whole = _write(tmp_path / "whole.jsonl", {"id": "w", "prompt": "p"})
    parse_study({"study": {"models": ["smollm2"], "actions": [
        "decoding-knorm:interval=4,target=16", "kivi:bits=4"]},
        "documents": [{"source": "jsonl", "path": str(whole)}]}, read_documents=True)
    parse_study({"study": {"models": ["smollm2"], "actions": [
        "snapkv-half", "adakv-snapkv:ratio=0.5", "full@int4"]},
        "documents": [{"source": "jsonl", "path": str(_docs(tmp_path))}]},
        read_documents=True)


# --- press objects: refused before anything is written ----------------------------------------

def _decoding_presses():
    import kvpress

    def decoding():
        return kvpress.DecodingPress(base_press=kvpress.KnormPress(), compression_interval=4,
                                     target_size=16)

    return {
        "dec": decoding(),
        "ada-dec": kvpress.DecodingPress(base_press=kvpress.AdaKVPress(kvpress.KnormPress()),
                                         compression_interval=4, target_size=16),
        "ratio-dec": kvpress.CompressionRatioDecodingPress(
            base_press=kvpress.KnormPress(), compression_interval=4,
            target_compression_ratio=0.5),
        "pre-dec": kvpress.PrefillDecodingPress(
            prefilling_press=kvpress.SnapKVPress(compression_ratio=0.5),
            decoding_press=decoding()),
        "dms": kvpress.DMSPress(press=kvpress.KnormPress(), decoding=True),
        "cam": kvpress.CAMPress(base_press=kvpress.KnormPress(), compression_interval=4,
                                target_size=16),
    }


MEASURED_OBJECTS = ("dec", "pre-dec")  # replayed from the question's step
REFUSED_OBJECTS = ("ada-dec", "ratio-dec", "dms", "cam")


@pytest.mark.parametrize("name", REFUSED_OBJECTS)
@pytest.mark.parametrize("out", ["out", None])
def test_measure_refuses_a_decoding_press_object_with_nothing_written(name, out, tmp_path):
    press = _decoding_presses()[name]
    folder = None if out is None else tmp_path / out
    with pytest.raises(ValueError) as refused:
        kvdrift.measure(actions={"snapkv-half": "snapkv-half", name: press}, docs=_docs(tmp_path),
                        out=folder, replicates=1, horizon=2)
    assert str(refused.value) == (
        f"action {name!r} compresses during decoding; {MEASURED}, and document 'asks' asks a "
        f"question after its context (give 'prompt', not 'context' and 'question')")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]  # no store


def test_a_prefill_press_object_passes_and_its_quantizer_chain_is_refused(tmp_path):
    import kvpress

    from kvdrift.api import study_from_arguments

    docs = str(_docs(tmp_path))
    prefill = kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.SnapKVPress(compression_ratio=0.5), decoding_press=None)
    study_from_arguments("smollm2", {"mine": prefill, "dms": kvpress.DMSPress(
        press=kvpress.KnormPress(), decoding=False)}, docs)
    with pytest.raises(ValueError, match=r"^action 'mine\+kivi:bits=4' quantizes the cache; "
                       r".*document 'asks' asks a question after its context"):
        study_from_arguments("smollm2", {"mine": prefill,
                                         "mine+kivi:bits=4": "mine+kivi:bits=4"}, docs)


def test_generated_documents_meet_the_same_refusal_before_the_store(tmp_path):
    """Documents known only once a tokenizer sizes them are held by the factory's check, which
    runs before the store is created: the press object's refusal names the document."""
    from kvdrift.data.document import Document
    from kvdrift.lm.factory import check_questions_fit

    docs = [Document(id="w", prompt="p"), Document(id="q", prompt="c", question="?")]
    presses = _decoding_presses()
    check_questions_fit(docs, list(MEASURED_OBJECTS), presses)
    for name in REFUSED_OBJECTS:
        with pytest.raises(ValueError, match=rf"^action '{name}' compresses during decoding; "
                           r".*document 'q' asks a question"):
            check_questions_fit(docs, [name], presses)
    with pytest.raises(ValueError, match=r"^action 'kivi:bits=4' quantizes the cache"):
        check_questions_fit(docs, ["snapkv-half", "kivi:bits=4"], presses)
    check_questions_fit(docs[:1], list(presses), presses)  # whole prompts take them all


# --- measured: Q's greedy rows are kvpress's pipeline's ---------------------------------------

CONTEXT = ("The museum opened in 1921 in a former railway station. Its first curator, Ada Lind, "
           "collected clocks, maps and letters from sailors. In 1950 a fire destroyed the east "
           "wing.")
QUESTION = "Who was the first curator?"
HORIZON = 16


def _pipeline_answer(loaded, press):
    """kvpress's pipeline's greedy answer to QUESTION over CONTEXT, as its own token ids."""
    import kvpress

    pipe = kvpress.KVPressTextGenerationPipeline(model=loaded.model, tokenizer=loaded.tokenizer)
    captured, decode = [], loaded.tokenizer.decode

    def capture(ids, **kwargs):
        captured.append([int(i) for i in ids])
        return decode(ids, **kwargs)

    loaded.tokenizer.decode = capture
    try:
        pipe(CONTEXT, question=QUESTION, press=press, max_new_tokens=HORIZON)
    finally:
        del loaded.tokenizer.decode
    return captured[0]


def _measured_presses(name):
    import kvpress

    def decoding(base, interval, target):
        return kvpress.DecodingPress(base_press=base, compression_interval=interval,
                                     target_size=target)

    return {  # the question's inputs scored with the next two steps' / the question's step
        # compressing at once (12 question tokens >= target_size) / after a prefill press
        "scores-the-question": decoding(
            kvpress.ExpectedAttentionPress(n_future_positions=64, n_sink=2), 3, 36),
        "question-compresses": decoding(kvpress.KnormPress(), 4, 8),
        "prefill-then-decoding": kvpress.PrefillDecodingPress(
            prefilling_press=kvpress.KnormPress(compression_ratio=0.5),
            decoding_press=decoding(kvpress.KnormPress(), 3, 30)),
    }[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["scores-the-question", "question-compresses",
                                  "prefill-then-decoding"])
def test_a_decoding_press_over_a_question_answers_as_kvpress_pipeline(embedded_smollm2, name):
    """kvpress's pipeline runs the question inside the press as its first decoding step (its
    inputs buffered, compressing at once where the question is as long as the target): Q's
    greedy row is the pipeline's answer token for token, from rows that keep every entry and
    rows that keep only the press's."""
    from kvdrift.data.document import Document
    from kvdrift.lm.factory import LMPairFactory

    press = _measured_presses(name)
    wanted = _pipeline_answer(embedded_smollm2, press)
    pair = LMPairFactory(embedded_smollm2, presses={name: press})(
        Document("d", CONTEXT, question=QUESTION), name)
    assert greedy_until_eos(pair, rewind=True, horizon=HORIZON) == wanted
    assert greedy_until_eos(pair, rewind=False, horizon=HORIZON) == wanted
