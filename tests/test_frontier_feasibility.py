"""What the frontier refuses before it works, and what stops it: settings that can certify
nothing (pure arithmetic, before torch, transformers or kvpress load), values the bound cannot
take (non-finite, outside the range or a stated cap, anywhere in a look), and the seeds of
looks (a hash of the search's seed and the look: reruns with another seed share no stream)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvdrift.frontier_search.betting import BET, bound, rounds_suggested
from kvdrift.frontier_search.families import parse_family
from kvdrift.frontier_search.feasibility import check_feasible, fewest_replicates
from kvdrift.frontier_search.measure import parse_measure
from kvdrift.frontier_search.search import Sample, SearchSettings, frontier_search
from kvdrift.frontier_search.study import look_seed

R_TV = parse_measure("R_tv <= 0.1")


@pytest.mark.parametrize(("measure", "documents", "needed"), [
    ("R_tv <= 0.1", 1, 53), ("R_tv <= 0.05", 1, 100), ("R_tv <= 0.05", 2, 51),
    ("R_tv <= 0.05", 3, 34), ("R_tv <= 0.02", 6, 40), ("R_tv <= 0.1", 6, 9),
    ("acceptance >= 0.9", 6, 9)])
def test_the_fewest_replicates_any_budget_needs(measure, documents, needed):
    """Every value at the best end of the range, three families at alpha 0.05: the bound
    reaches the tolerance after exactly this many rounds (the issue's numbers with the bet
    before it: 54 at 0.1 with one document, 45 at 0.02 with six)."""
    m = parse_measure(measure)
    assert fewest_replicates(m, documents, 0.05, 3) == needed
    level = 0.05 / 3
    best = np.full((needed, documents), m.range[0] if m.op == "<=" else m.range[1])
    certify = bound(best, level, m.tolerance, *m.range, upper=m.op == "<=")
    before = bound(best[:-1], level, m.tolerance, *m.range, upper=m.op == "<=")
    assert m.meets(certify) and not m.meets(before)
    with pytest.raises(ValueError, match=f"needs {needed} replicates per document"):
        check_feasible(m, documents, 0.05, 3, needed - 1)
    check_feasible(m, documents, 0.05, 3, needed)


IMPOSSIBLE = [  # (measure, documents): more than 32 replicates needed even at all-zero values
    ("R_tv <= 0.1", 1), ("R_tv <= 0.05", 1), ("R_tv <= 0.05", 3), ("R_tv <= 0.02", 6)]


@pytest.mark.parametrize(("measure", "documents"), IMPOSSIBLE)
def test_impossible_settings_are_refused_before_any_model_loads(measure, documents, tmp_path):
    """In a fresh interpreter, in one line with the number, in under 2 s of CPU and with
    none of torch, transformers or kvpress imported."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "prompt": "a prompt"}) + "\n"
                            for i in range(documents)))
    args = ["frontier", "--measure", measure, "--max-replicates", "32",
            "--out", str(tmp_path / "out")] + (["--docs", str(docs)] if documents != 6 else [])
    code = ("import sys, time; from typer.testing import CliRunner; from kvdrift.cli import app;"
            f"r = CliRunner().invoke(app, {args!r});"
            "heavy = [m for m in ('torch', 'transformers', 'kvpress') if m in sys.modules];"
            "print(r.exit_code, time.process_time(), heavy); print(r.output)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env={"PYTHONPATH": str(Path(__file__).parents[1] / "src"),
                                           "PATH": "/usr/bin:/bin"}, check=True).stdout
    status, output = out.split("\n", 1)
    exit_code, cpu, heavy = status.split(" ", 2)
    assert exit_code == "2" and heavy == "[]" and float(cpu) < 2.0, status
    line = " ".join(output.split())
    need = fewest_replicates(parse_measure(measure), documents, 0.05, 3)
    assert need > 32
    assert "no budget can be certified with --max-replicates 32" in line
    assert f"needs {need} replicates per document" in line and f"to {need}" in line
    assert not (tmp_path / "out").exists()


class _Looks:
    """Per look, the values of every budget (NaN: absent by design)."""

    def __init__(self, looks):
        self.looks = looks

    def evaluate(self, budgets, look, replicates):
        values = self.looks[min(look, len(self.looks)) - 1]
        return {b: Sample({d: np.asarray(v, dtype=float) for d, v in values.items()}, 0.5, 1)
                for b in budgets}


@pytest.mark.parametrize(("values", "shown"), [
    ({"a": [0.0, np.inf, 0.0], "b": [0.0, 0.0, 0.0]}, "inf"),  # a counted round
    ({"a": [0.0, 0.0, 3.0], "b": [0.0, 0.0, np.nan]}, "3"),  # the left-out tail of a look
    ({"a": [0.0, -np.inf, 0.0], "b": [0.0, 0.0, 0.0]}, "-inf"),
])
def test_kl_with_a_cap_stops_at_any_value_the_bound_cannot_take(values, shown):
    kl = parse_measure("kl <= 0.5", cap=2.0)
    with pytest.raises(ValueError) as err:
        frontier_search([parse_family("kivi")], kl, _Looks([values]),
                        SearchSettings(replicates=3, max_replicates=30))
    assert str(err.value).startswith(f"kl value {shown} at kivi 8 bits, document a, lies "
                                     "outside [0, 2], the stated cap")


def test_values_absent_by_design_are_left_out_and_values_outside_a_range_refused():
    ok = frontier_search([parse_family("kivi")], R_TV, _Looks(
        [{"a": [0.0] * 8, "b": [0.0] * 7 + [np.nan]}]), SearchSettings(max_replicates=64))
    assert ok.families[0].budgets[0].status == "certified"
    with pytest.raises(ValueError, match=r"R_tv value 1.5 at kivi 8 bits, document b, lies "
                                         r"outside \[0, 1\], the measure's range"):
        frontier_search([parse_family("kivi")], R_TV, _Looks(
            [{"a": [0.0] * 8, "b": [0.0] * 7 + [1.5]}]), SearchSettings())


def test_an_undecided_budget_says_how_many_more_replicates_its_values_suggest():
    good = frontier_search([parse_family("kivi")], R_TV, _Looks(
        [{"a": [0.0, 0.1] * 4, "b": [0.05] * 8}]), SearchSettings(max_replicates=8))
    first = good.families[0].budgets[0]
    assert first.status == "undecided" and 0 < first.more_replicates < math.inf
    assert first.to_json()["more_replicates"] == first.more_replicates
    assert f"about {first.more_replicates:.0f} more replicates" in first.more_text()
    bad = frontier_search([parse_family("kivi")], R_TV, _Looks(
        [{"a": [0.2] * 8, "b": [0.1] * 8}]), SearchSettings(max_replicates=8))
    worst = bad.families[0].budgets[0]
    assert worst.status == "undecided" and worst.more_replicates == math.inf
    assert "no number of replicates suffices" in worst.more_text()
    # the suggestion is roughly right: the values' own law certifies near it
    rng = np.random.default_rng(0)
    values = (rng.random((400, 6)) < 0.05).astype(float)
    more = rounds_suggested(values[:16], 0.05 / 3, 0.1, 0.0, 1.0)
    hit = np.nonzero([bound(values[:t], 0.05 / 3, 0.1, 0.0, 1.0) <= 0.1
                      for t in range(16, 400, 8)])[0]
    assert hit.size and 0.3 < (8 * hit[0]) / more < 3


def test_each_look_has_its_own_stream_and_other_seeds_share_none():
    seeds = {(s, look): look_seed(s, look) for s in range(20) for look in range(1, 20)}
    assert len(set(seeds.values())) == len(seeds)  # seed s + 1 no longer replays look 2
    assert look_seed(3, 2) == look_seed(3, 2) and 0 <= look_seed(3, 2) < 2 ** 56


def test_the_bet_stakes_from_the_first_round():
    values = np.zeros((1, 6))
    assert BET.fractions(values, 0.1, 0.0, 1.0)[0] > 0  # no replicate spent on nothing
    assert BET.log_wealth(values, 0.1, 0.1, 0.0, 1.0)[0] > 0


def test_the_command_line_counts_the_default_documents_as_the_study_makes_them():
    """The frontier's feasibility check counts the default documents without loading the study
    module; the count it assumes must be what the default sources generate."""
    from kvdrift.cli.frontier import DEFAULT_DOCUMENT_COUNT
    from kvdrift.data.ruler import document_count
    from kvdrift.study_config import DEFAULT_DOCUMENTS, parse_study

    config = parse_study({"study": {"models": ["m"], "actions": ["full"]},
                          "documents": [DEFAULT_DOCUMENTS]})
    (ruler,) = config.documents
    assert document_count(ruler.config) == DEFAULT_DOCUMENT_COUNT
    made = ruler.documents(lambda text: len(text.split()))  # as many as it says it makes
    assert len(made) == DEFAULT_DOCUMENT_COUNT


def test_the_python_frontier_refuses_what_cannot_be_certified_before_any_work(tmp_path):
    import kvdrift

    out = tmp_path / "fr"
    with pytest.raises(ValueError, match="needs 40 replicates per document"):
        kvdrift.frontier(measure="R_tv <= 0.02", max_replicates=32, out=out)
    assert not out.exists()


def test_a_search_never_uses_more_replicates_than_its_cap():
    """One document, ``R_tv <= 0.1``: 53 rounds are needed even at all-zero values, so a cap
    of 52 is refused, and a search capped at 52 (not a multiple of its looks of 8) cuts its
    last look at 52 and certifies nothing (before issue 50 it drew 56 and certified at 53,
    which the feasibility check said it could not)."""
    with pytest.raises(ValueError, match="needs 53 replicates per document"):
        check_feasible(R_TV, 1, 0.05, 3, 52)
    looks = _Looks([{"a": [0.0] * 8}])
    fam = [parse_family(n) for n in ("snapkv", "recent", "kivi")]
    capped = frontier_search(fam, R_TV, looks, SearchSettings(max_replicates=52))
    first = capped.families[0].budgets[0]
    assert (first.status, first.replicates, first.rounds) == ("undecided", 52, 52)
    assert capped.best is None
    enough = frontier_search(fam, R_TV, looks, SearchSettings(max_replicates=53))
    first = enough.families[0].budgets[0]
    assert (first.status, first.decided_at, first.replicates) == ("certified", 53, 53)


def test_documents_without_an_answer_are_not_counted_for_the_task_measure(tmp_path):
    """Two of six documents carry an answer: the task measure's rounds hold two values, so
    the check counts two (at ``task >= 0.9`` two documents need 51 replicates,
    six 17); a measure that every document gives counts all six."""
    from kvdrift.cli.frontier import check_certifiable

    task = parse_measure("task >= 0.9")
    assert fewest_replicates(task, 2, 0.05, 3) > 32 >= fewest_replicates(task, 6, 0.05, 3)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "prompt": "a prompt",
                                        **({"answer": "yes"} if i < 2 else {})}) + "\n"
                            for i in range(6)))
    settings = SearchSettings(max_replicates=32)
    with pytest.raises(ValueError, match="over 3 families and 2 documents"):
        check_certifiable("task >= 0.9", None, docs, settings, 3)
    check_certifiable("R_tv <= 0.1", None, docs, settings, 3)  # six documents: 9 needed
