"""The long ``chain`` task (data/chain_task.py): a counter tracked through many changes, its
answer the value after the last, scored on the final answer only (data/scoring.py)."""

from __future__ import annotations

import random

import pytest

from kvdrift.data import TASK_FAMILIES, RulerConfig, generate, make_document
from kvdrift.data.chain_task import CHAIN_MAX, CHAIN_STEP, ChainTask
from kvdrift.data.scoring import final_answer, metric_name, score_text


def whitespace_tokens(text: str) -> int:
    return len(text.split())


def test_the_counter_is_the_sum_of_its_changes_and_stays_in_range():
    task = ChainTask(random.Random(7))
    for n in (0, 1, 5, 200):
        assert task.answer(n) == task.start + sum(task.changes[:n])
    assert all(0 <= v <= CHAIN_MAX for v in task.values)
    assert all(1 <= abs(c) <= CHAIN_STEP for c in task.changes)
    # a longer prompt extends a shorter one: the same changes, whatever was asked first
    other = ChainTask(random.Random(7))
    assert other.render(3) in task.render(3) and other.answer(3) == task.answer(3)


def test_the_prompt_lists_each_change_in_order():
    task = ChainTask(random.Random(1))
    text = task.render(4)
    for i, c in enumerate(task.changes[:4], start=1):
        assert f"\n{i}. {'add' if c > 0 else 'take away'} {abs(c)}\n" in text + "\n"
    assert f"Start: {task.start}\n" in text
    assert "(4 changes)" in text and text.endswith("Working:")
    assert "\n5. " not in text.split("Now the task")[1]


def test_a_chain_document_is_sized_and_scored_on_its_final_answer():
    doc = make_document("chain", 600, whitespace_tokens, seed=2, index=1)
    steps = doc.meta["steps"]
    assert doc.meta["n_tokens"] <= 600 and steps > 20
    assert doc.answer == str(doc.meta["values"][-1])
    assert doc.stratum == "chain-600" and metric_name(doc) == "final_answer"
    assert doc == make_document("chain", 600, whitespace_tokens, seed=2, index=1)
    right = f"Step 1: ...\nFinal answer: {doc.answer}"
    assert score_text(doc, right) == 1.0
    assert score_text(doc, f"the counter passes {doc.answer} on the way") == 0.0


def test_chain_is_offered_but_not_a_default_family():
    assert "chain" in TASK_FAMILIES and "chain" not in RulerConfig().families
    docs = generate(RulerConfig(families=("chain", "vt"), target_lengths=(600,),
                                documents_per_stratum=2), whitespace_tokens)
    assert [d.stratum for d in docs] == ["chain-600"] * 2 + ["vt-600"] * 2


@pytest.mark.parametrize(("output", "score"), [
    ("Final answer: 42", 1.0),
    ("final ANSWER:42.", 1.0),  # case and spacing
    ("Final answer: 42.0", 1.0),  # the same number
    ("Step 3: 40 + 2 = 42", 0.0),  # no final answer
    ("Final answer: 41\nwait. Final answer: 42", 1.0),  # the last one counts
    ("Final answer: 42\nFinal answer: 41", 0.0),
    ("Final answer: 142", 0.0),  # a whole number, not a substring
    ("Final answer: -42", 0.0),
    ("Final answer: none", 0.0),
    ("Final answer:", 0.0),
    ("", 0.0),
])
def test_final_answer_metric(output, score):
    assert final_answer(output, ["42"]) == score


def test_final_answer_needs_an_answer():
    with pytest.raises(ValueError, match="at least one expected answer"):
        final_answer("Final answer: 1", [])
