"""Task metrics against RULER's definitions on hand-made outputs, and which metric a document
gets."""

import math

import pytest

from kvdrift.data.document import Document
from kvdrift.data.ruler import make_document
from kvdrift.data.scoring import (
    expected_answers,
    metric_name,
    postprocess,
    score_text,
    string_match_all,
    string_match_part,
)
from tests.messages import whole


def ruler_all(pred, refs):
    """RULER's string_match_all: the mean over refs of ``r.lower() in pred.lower()``."""
    return sum(1.0 if r.lower() in pred.lower() else 0.0 for r in refs) / len(refs)


def ruler_part(pred, refs):
    """RULER's string_match_part for one output: max over refs of the same test."""
    return max(1.0 if r.lower() in pred.lower() else 0.0 for r in refs)


CASES = [  # (output, expected answers, string_match_all, string_match_part)
    ("The special magic number is 4821937.", ["4821937"], 1.0, 1.0),
    ("the answer is AMBER", ["amber"], 1.0, 1.0),  # case-insensitive
    ("Answer: amber.", ["Amber"], 1.0, 1.0),  # punctuation around the answer is fine
    ("48-21937", ["4821937"], 0.0, 0.0),  # ...but inside it the substring is broken
    ("", ["4821937"], 0.0, 0.0),  # empty output
    ("   \n", ["x"], 0.0, 0.0),  # whitespace only
    ("apple, pear", ["apple", "pear", "plum", "fig"], 0.5, 1.0),  # several answers
    ("APPLE PEAR PLUM FIG", ["apple", "pear", "plum", "fig"], 1.0, 1.0),
    ("nothing here", ["apple", "pear"], 0.0, 0.0),
    ("pineapple", ["apple"], 1.0, 1.0),  # a plain substring test, as RULER's
    ("x\x00y 12", ["x\ny", "12"], 1.0, 1.0),  # control characters become newlines (RULER)
]


@pytest.mark.parametrize(("output", "answers", "want_all", "want_part"), CASES)
def test_metrics_match_ruler_definitions(output, answers, want_all, want_part):
    assert string_match_all(output, answers) == want_all
    assert string_match_part(output, answers) == want_part
    if "\x00" not in output:  # RULER cleans outputs before matching; the rest need no cleaning
        assert string_match_all(output, answers) == ruler_all(output, answers)
        assert string_match_part(output, answers) == ruler_part(output, answers)


def test_postprocess_is_rulers():
    assert postprocess("  a\tb\x1fc \n") == "a\nb\nc"


def test_no_answers_is_refused():
    with pytest.raises(ValueError, match="at least one expected answer"):
        string_match_all("text", [])


def test_expected_answers_and_metric_per_document():
    free = Document("f", "a prompt")
    assert expected_answers(free) is None and math.isnan(score_text(free, "anything"))
    single = Document("s", "p", answer="Blue")
    assert expected_answers(single) == ("Blue",)
    assert metric_name(single) == "string_match_all"
    listed = Document("l", "p", answer="a, b", meta={"answers": ["a", "b"]})
    assert expected_answers(listed) == ("a", "b")
    assert score_text(listed, "only a") == 0.5
    qa = Document("q", "p", answer="x, y", meta={"answers": ["x", "y"], "family": "qa_1"})
    assert metric_name(qa) == "string_match_part" and score_text(qa, "x") == 1.0
    named = Document("n", "p", answer="x", meta={"answers": ["x", "y"],
                                                 "metric": "string_match_part"})
    assert score_text(named, "y!") == 1.0
    with pytest.raises(ValueError, match=whole(
            "document 'b': key 'metric' must be one of string_match_all, string_match_part, "
            "final_answer; "
            "got 'exact'")):
        metric_name(Document("b", "p", answer="x", meta={"metric": "exact"}))
    changed = Document("c", "p", answer="x")
    changed.meta["metric"] = "exact"  # after the document was checked: metric_name refuses it
    with pytest.raises(ValueError, match=whole(
            "document 'c': key 'metric' must be one of string_match_all, string_match_part, "
            "final_answer; "
            "got 'exact'")):
        metric_name(changed)


@pytest.mark.parametrize("family", ["niah_multivalue", "vt", "cwe", "fwe"])
def test_ruler_families_use_string_match_all(family):
    doc = make_document(family, 600, lambda s: len(s.split()), seed=1)
    answers = expected_answers(doc)
    assert metric_name(doc) == "string_match_all" and len(answers) > 1
    assert score_text(doc, " ".join(answers).upper()) == 1.0
    assert score_text(doc, answers[0]) == pytest.approx(1 / len(answers))


def test_jsonl_documents_name_their_metric(tmp_path):
    from kvdrift.data.loaders import load_jsonl

    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": 1, "prompt": "p", "answer": "x", "metric": "string_match_part", '
                    '"answers": ["x", "y"]}\n')
    doc = load_jsonl(path)[0]
    assert metric_name(doc) == "string_match_part" and score_text(doc, "Y.") == 1.0
    path.write_text('{"id": 1, "prompt": "p", "answer": "x", "metric": "f1"}\n')
    with pytest.raises(ValueError, match=whole(
            f"{path}:1: key 'metric' must be one of string_match_all, string_match_part, "
            "final_answer; "
            "got 'f1'")):
        load_jsonl(path)


def test_every_metric_name_documents_accept_has_a_scoring_function():
    """Documents check names against metric_names without importing scoring; the two agree."""
    from kvdrift.data.metric_names import METRIC_NAMES
    from kvdrift.data.scoring import METRICS

    assert tuple(METRICS) == METRIC_NAMES
