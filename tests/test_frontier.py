"""The frontier search on finite worlds with known risk curves, its parts, and its CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from frontier_worlds import HORIZON, VOCAB, FiniteEvaluator, world

from kvdrift.finite.systems import random_pair
from kvdrift.frontier_search.families import RATIO_STEPS, parse_family
from kvdrift.frontier_search.measure import parse_measure
from kvdrift.frontier_search.result import pareto
from kvdrift.frontier_search.search import Sample, SearchSettings, frontier_search
from tests.messages import whole

MEASURE = parse_measure("R_tv <= 0.1")


def _search(w: FiniteEvaluator, alpha: float = 0.1, replicates: int = 8,
            max_replicates: int = 32, measure=MEASURE, exhaustive: bool = False,
            sized_looks: bool = True):
    fams = [f for f, _ in w.families.values()]
    return frontier_search(fams, measure, w, SearchSettings(
        alpha, replicates, max_replicates, exhaustive=exhaustive, sized_looks=sized_looks))


def test_true_curves_are_monotone_and_cross_the_tolerance():
    w = world({"snapkv": 0.6, "recent": 3.0})
    for name, (fam, _) in w.families.items():
        curve = [w.truth(name, b) for b in fam.budgets]
        assert np.all(np.diff(curve) >= 0), name  # less cache, more risk
        assert curve[0] < curve[-1]
    snap = [w.truth("snapkv", b) for b in w.families["snapkv"][0].budgets]
    assert snap[0] < 0.1 < snap[-1]


def _wrong(seeds: int, alpha: float) -> tuple[int, int]:
    """Seeds in which some certified budget's exact risk breaks the tolerance, and seeds in
    which some budget labelled 'fails' meets it (finite worlds, exact risks)."""
    wrong_certified = wrong_fails = 0
    for seed in range(seeds):
        w = world({"snapkv": 0.6, "recent": 1.0}, seed=seed)
        r = _search(w, alpha=alpha)
        budgets = {(f, b.label): b for f, (fam, _) in w.families.items() for b in fam.budgets}
        truth = {(b.family, b.label): w.truth(b.family, budgets[(b.family, b.label)])
                 for f in r.families for b in f.budgets}
        rows = [b for f in r.families for b in f.budgets]
        wrong_certified += any(b.status == "certified" and truth[(b.family, b.label)] > 0.1
                               for b in rows)
        wrong_fails += any(b.status == "fails" and truth[(b.family, b.label)] <= 0.1
                           for b in rows)
        for b in rows:  # a certified budget's own bound lies within the tolerance
            assert b.status != "certified" or b.hi <= MEASURE.tolerance
    return wrong_certified, wrong_fails


def test_certified_and_failing_labels_hold_at_the_stated_rate():
    """8 seeds at alpha = 0.3: some certified budget breaks the exact tolerance in at most
    30% of seeds, and likewise for 'fails'. False alarm: if a rate were exactly 0.3,
    P(7 or more of 8) = 0.0013 (binomial tail)."""
    wrong_certified, wrong_fails = _wrong(8, 0.3)
    assert wrong_certified <= 6 and wrong_fails <= 6, (wrong_certified, wrong_fails)


@pytest.mark.slow
def test_certified_and_failing_labels_hold_over_many_seeds():
    """40 seeds at alpha = 0.2. False alarm: if a rate were exactly 0.2, P(16 or more of
    40) = 0.006 (binomial tail)."""
    wrong_certified, wrong_fails = _wrong(40, 0.2)
    assert wrong_certified <= 15 and wrong_fails <= 15, (wrong_certified, wrong_fails)


def test_a_much_worse_family_is_reported_dominated():
    w = world({"snapkv": 0.5, "recent": 8.0}, seed=3)
    r = _search(w)
    assert r.best is not None and r.best.family == "snapkv"
    assert r.dominated == ("recent",)
    assert json.loads(json.dumps(r.to_json()))["families"]["recent"]["dominated"] is True
    assert "no better" in r.to_json()["monotonicity"]


def test_the_sequence_stops_at_the_first_budget_not_certified():
    """Nothing after a failing or undecided budget is run; a budget within on its own bound
    after one that is not is 'blocked', never certified."""
    w = world({"snapkv": 0.6, "recent": 3.0}, seed=1)
    r = _search(w)
    for f in r.families:
        statuses = [b.status for b in f.budgets]
        first = next((i for i, s in enumerate(statuses) if s != "certified"), len(statuses))
        assert all(s == "certified" for s in statuses[:first])
        assert all(s != "certified" for s in statuses[first:])
        indices = [b.index for b in f.budgets]
        assert indices == list(range(len(indices)))  # a prefix of the axis, nothing skipped
        assert len(indices) <= first + SearchSettings().window


def test_search_spends_fewer_calls_than_the_full_grid_at_the_same_decision():
    """The exhaustive search (every budget until decided, same seeds) spends several times
    the calls; asserted on 2 seeds, with every budget either certifies truly within (exact
    risk). The two may certify different budgets: a budget the sequence reaches later draws
    the values of later looks (with torch's 32-bit CPU seeds they happened to agree here)."""
    calls = grid_calls = 0
    for seed in range(2):
        found = []
        for exhaustive in (False, True):
            w = world({"snapkv": 0.6, "recent": 1.0}, seed=seed)
            r = _search(w, exhaustive=exhaustive, sized_looks=False)
            assert r.calls == w.calls
            found.append(r)
        search, grid = found
        assert all(w.truth(f.family, f.certified) <= 0.1 for r in found for f in r.families
                   if f.certified is not None)
        assert any(f.certified for f in search.families)
        assert grid.calls <= grid.full_grid_calls == search.full_grid_calls
        calls, grid_calls = calls + search.calls, grid_calls + grid.calls
    assert calls < 0.5 * grid_calls


def test_same_seed_same_search_and_other_seed_other_samples():
    a = _search(world({"snapkv": 0.6}, seed=5)).to_json()
    b = _search(world({"snapkv": 0.6}, seed=5)).to_json()
    c = _search(world({"snapkv": 0.6}, seed=6)).to_json()
    assert a == b
    assert a != c


def test_a_family_not_monotone_in_its_budget_is_flagged_and_not_dominated():
    w = world({"snapkv": 0.2, "recent": 0.2}, seed=2)

    class Flipped(FiniteEvaluator):
        def pair(self, name, budget, doc):  # recent: the second budget drifts the most
            if name == "recent" and budget.index == 1:
                return random_pair(VOCAB, HORIZON, 1000 + doc, mix=1.0)
            return super().pair(name, budget, doc)

    f = Flipped(w.families, w.documents, w.replicates, w.seed)
    fams = [fam for fam, _ in w.families.values()]
    r = frontier_search(fams, MEASURE, f, SearchSettings(0.1, 8, 64, exhaustive=True))
    assert any("recent: not monotone" in m for m in r.warnings), r.to_frame()
    assert "recent" not in r.dominated
    recent = {b.index: b.status for b in r.families[1].budgets}
    assert recent[1] == "fails" and "blocked" in recent.values()
    assert "certified" not in list(recent.values())[1:]


def test_the_scheme_splits_alpha_across_families_and_budgets():
    w = world({"snapkv": 0.6, "kivi": 0.6})
    r = _search(w, alpha=0.1)
    assert r.scheme.certify_level == pytest.approx(0.05)
    assert r.scheme.fail_level == pytest.approx(0.1 / (RATIO_STEPS - 1 + 3))
    saved = r.to_json()
    assert saved["multiplicity"]["certify_level"] == pytest.approx(0.05)
    assert "betting" in saved["bound_method"] and saved["scope"] == "these 3 documents"
    assert "these 3 documents" in r.guarantee()


class _Fixed:
    """An evaluator returning fixed values per budget (one look each, replicates drawn)."""

    def __init__(self, values, kv):
        self.values, self.kv, self.looks = values, kv, 0

    def evaluate(self, budgets, look, replicates):
        self.looks += 1
        return {b: Sample({d: np.asarray(v, dtype=float) for d, v in
                           self.values(b, look).items()}, self.kv(b), 1) for b in budgets}


def test_an_unbounded_measure_without_a_cap_is_never_certified():
    fam = parse_family("kivi")
    ev = _Fixed(lambda b, look: {"a": [0.001] * 4, "b": [0.002] * 4}, lambda b: 0.5)
    r = frontier_search([fam], parse_measure("kl <= 0.02"), ev, SearchSettings(replicates=4))
    statuses = {b.status for b in r.families[0].budgets}
    assert statuses == {"estimate within"} and r.families[0].certified is None
    assert r.best is None and not r.certifiable
    assert "not certified" in r.guarantee() and "certified" not in str(r.to_json()["best"])
    capped = frontier_search([fam], parse_measure("kl <= 0.1", cap=1.0), _Fixed(
        lambda b, look: {"a": [0.0] * 4, "b": [0.0] * 4}, lambda b: 0.5),
        SearchSettings(replicates=4, max_replicates=64))
    assert capped.certifiable and capped.families[0].budgets[0].status == "certified"
    with pytest.raises(ValueError, match=r"kl value 2 at kivi 8 bits, document a, lies "
                                         r"outside \[0, 1\], the stated cap"):
        frontier_search([fam], parse_measure("kl <= 0.02", cap=1.0), _Fixed(
            lambda b, look: {"a": [2.0] * 4}, lambda b: 0.5), SearchSettings(replicates=4))
    with pytest.raises(ValueError, match="only for an unbounded measure"):
        parse_measure("R_tv <= 0.1", cap=1.0)


def test_unknown_kv_fraction_ties_and_replicate_counts():
    """A NaN kv_fraction never wins; a tie is reported, not settled silently; ``replicates``
    counts draws and ``rounds`` the values the bound used (NaNs left out)."""
    zeros = {"a": [0.0] * 8, "b": [0.0] * 7 + [np.nan]}
    fams = [parse_family("kivi"), parse_family("gguf"), parse_family("fp8")]
    kv = {"kivi": np.nan, "gguf": 0.25, "fp8": 0.25}
    ev = _Fixed(lambda b, look: zeros, lambda b: kv[b.family])
    r = frontier_search(fams, MEASURE, ev, SearchSettings(replicates=8, max_replicates=64))
    assert r.best is not None and r.best.family == "gguf"
    assert [t.family for t in r.ties] == ["fp8"]
    assert any("tie" in w for w in r.warnings) and any("kv_fraction is unknown" in w
                                                       for w in r.warnings)
    first = r.families[1].budgets[0]
    assert first.replicates == 8 * first.looks and first.rounds == 7 * first.looks
    assert all(np.isfinite(b.kv_fraction) for b in r.frontier)


def test_pareto_keeps_certified_points_no_other_beats():
    w = world({"snapkv": 0.6, "recent": 1.0}, seed=1)
    r = _search(w)
    pts = tuple(b for f in r.families for b in f.budgets)
    front = pareto(pts, "<=")
    assert front and all(p.status == "certified" for p in front)
    for p in pts:
        if p.status == "certified" and p not in front:
            assert any(q.kv_fraction <= p.kv_fraction and q.hi <= p.hi for q in front)


@pytest.mark.parametrize(("text", "needle"), [
    ("R_tv < 0.1", "must read"), ("risk <= 0.1",
                             whole("measure name must be one of R_tv, R, F, kl, acceptance, task; "
                                   "got 'risk'")),
    ("R_tv >= 0.1", "smaller is better"),
    ("R_tv <= 2", r"^R_tv tolerance must be a number within \[0, 1\]; got 2.0$"),
    ("acceptance <= 0.9", "larger is better"), ("R_tv <= nan", "must read"),
])
def test_bad_measures_are_refused_in_one_line(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_measure(text)


def test_measures_parse_with_aliases():
    assert str(parse_measure("task diff >= -0.01")) == "task >= -0.01"
    assert parse_measure("acceptance >= 0.9").meets(0.91)
    assert not parse_measure("kl <= 0.02").meets(0.03)
    assert parse_measure("task >= -0.01").range == (-1.0, 1.0)


@pytest.mark.parametrize("text", ["", "snapkv:ratio=0.5", "kivi:bits=4", "nosuchpress"])
def test_bad_families_are_refused(text):
    with pytest.raises(ValueError):
        parse_family(text)


def test_a_blank_family_is_refused_naming_what_is_allowed():
    with pytest.raises(ValueError, match=whole("a family (a press or quantization name) must be "
                                               "a string with visible text; got ' '")):
        parse_family(" ")


def test_families_order_budgets_from_most_cache():
    snap = parse_family("snapkv+kivi:bits=4")
    assert snap.budgets[0].action == "snapkv:ratio=0.9375+kivi:bits=4"
    assert [b.label for b in snap.budgets][::4] == ["0.9375", "0.6875", "0.4375", "0.1875"]
    assert [b.label for b in parse_family("gguf").budgets][0] == "q8_0"


@pytest.fixture(scope="module")
def frontier_docs(tmp_path_factory):
    from kvdrift.data import Document, write_jsonl

    path = tmp_path_factory.mktemp("frontier-docs") / "docs.jsonl"
    write_jsonl([Document(f"d{i}", " ".join(f"word{(i * 7 + j) % 50}" for j in range(60)))
                 for i in range(2)], path)
    return path


def test_frontier_cli_runs_resumes_and_reports(tiny_model_dir_hd64, frontier_docs, tmp_path):
    """End to end on a tiny random model: stages stored, report and analysis.json written;
    the same command again computes nothing new and gives the same result."""
    from typer.testing import CliRunner

    from kvdrift.cli import app

    out = tmp_path / "fr"
    args = ["frontier", "--model", str(tiny_model_dir_hd64), "--docs", str(frontier_docs),
            "--families", "snapkv,kivi", "--measure", "R_tv <= 0.3", "--replicates", "2",
            "--max-replicates", "32", "--horizon", "4", "--out", str(out), "--device", "cpu",
            "--json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    result = json.loads(first.stdout[first.stdout.index("{"):])
    assert set(result["families"]) == {"snapkv", "kivi"}
    html = (out / "report" / "report.html").read_text()
    certified = [f for f in result["families"].values() if f["certified"]]
    assert certified, result  # the tiny model keeps R_tv within 0.3 at some budget
    assert html.count("<h4>") == len(certified) and "Examples at each family" in html
    assert (out / "report" / "figures" / "frontier.png").exists()
    saved = json.loads((out / "analysis.json").read_text())["frontier"]
    assert saved["calls"] == result["calls"] > 0
    stages = sorted(p.name for p in (out / "stages").iterdir())
    assert stages[0] == "01-look1"
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "stages").rglob("*.parquet")}
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout[again.stdout.index("{"):]) == result
    assert {p: p.stat().st_mtime_ns for p in (out / "stages").rglob("*.parquet")} == mtimes
    other = CliRunner().invoke(app, [*args[:-1], "--measure", "R_tv <= 0.2", "--json"])
    assert other.exit_code == 2 and "differs in: measure" in other.output


def test_python_api_frontier_returns_a_typed_result(tiny_model_dir, frontier_docs, tmp_path):
    import kvdrift
    from kvdrift.frontier_search.result import FrontierResult

    r = kvdrift.frontier(["recent"], "R <= 0.5", tmp_path / "fr", replicates=2, max_replicates=16,
                         model=str(tiny_model_dir), docs=frontier_docs, horizon=3,
                         device="cpu")
    assert isinstance(r, FrontierResult)
    frame = r.to_frame()
    assert {"family", "budget", "kv_fraction", "estimate", "lo", "hi", "status",
            "pareto"} <= set(frame.columns)
    assert (frame["family"] == "recent").all() and frame["pareto"].any()
    with pytest.raises(ValueError, match="no actions"):
        kvdrift.frontier(["recent"], actions=("snapkv-half",))


def test_frontier_never_writes_into_another_folder(tmp_path):
    from typer.testing import CliRunner

    from kvdrift.cli import app

    (tmp_path / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["frontier", "--out", str(tmp_path), "--families", "snapkv"])
    assert result.exit_code == 2 and "notes.txt" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    root = CliRunner().invoke(app, ["frontier", "--out", "/", "--families", "snapkv"])
    assert root.exit_code == 2 and "file-system root" in root.output


def test_kl_without_a_cap_never_says_certified(tiny_model_dir_hd64, frontier_docs, tmp_path):
    """An unbounded measure: the terminal, the report and analysis.json say "not certified"
    and never "certified" on its own; with --cap the statuses are the certified kind."""
    import re

    from typer.testing import CliRunner

    from kvdrift.cli import app

    out = tmp_path / "kl"
    args = ["frontier", "--model", str(tiny_model_dir_hd64), "--docs", str(frontier_docs),
            "--families", "kivi", "--measure", "kl <= 0.02", "--replicates", "2",
            "--horizon", "3", "--out", str(out), "--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    html = (out / "report" / "report.html").read_text()
    saved = (out / "analysis.json").read_text()
    for text in (" ".join(result.output.split()), html):
        assert "not certified" in text
        assert not re.findall(r"(?<!not )certified", text)
    saved = json.loads(saved)["frontier"]
    assert saved["best"] is None and saved["families"]["kivi"]["certified"] is None
    assert "not certified" in saved["guarantee"] and not saved["certifiable"]
    statuses = {b["status"] for b in saved["families"]["kivi"]["budgets"]}
    assert statuses <= {"estimate within", "estimate beyond"}
    capped = CliRunner().invoke(app, [*args[:-4], "--out", str(tmp_path / "capped"),
                                      "--device", "cpu", "--cap", "50", "--json",
                                      "--measure", "kl <= 20"])  # certifiable with 2 docs
    assert capped.exit_code == 0, capped.output
    frontier = json.loads(capped.stdout[capped.stdout.index("{"):])
    assert frontier["certifiable"] and "(stated cap)" in frontier["measure_range"]
    assert {b["status"] for b in frontier["families"]["kivi"]["budgets"]} <= {
        "certified", "blocked", "fails", "undecided"}


def test_weights_family_walks_weight_types_and_reads_weights_memory(tiny_model_dir,
                                                                    frontier_docs, tmp_path):
    """The ``weights`` family walks P's weights as llama.cpp's types, most bits first; its
    memory is Q's weights as each type stores them over P's weights (by hand: Q8_0 holds 34
    bytes per 32 weights of the decoder blocks' linear layers; the rest stays at float32);
    it joins no cache family."""
    import torch

    import kvdrift
    from kvdrift.lm.loading.model import load_model

    fam = parse_family("weights")
    assert [b.action for b in fam.budgets][:2] == ["full@q8_0", "full@q5_1"]
    assert fam.budgets[-1].action == "full@mxfp4"
    with pytest.raises(ValueError, match="one frontier ranks one memory"):
        from kvdrift.frontier_search.families import memory_column

        memory_column([fam, parse_family("snapkv")])
    r = kvdrift.frontier(["weights"], "R_tv <= 0.9", tmp_path / "fr", replicates=2,
                         max_replicates=4, model=str(tiny_model_dir), docs=frontier_docs,
                         horizon=3, device="cpu")
    model = load_model(str(tiny_model_dir)).model
    linear = sum(m.weight.numel() for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and n != "lm_head")
    total = sum(p.numel() for p in model.parameters())
    q8 = (linear // 32 * 34 + (total - linear) * 4) / (total * 4)
    first = next(b for b in r.families[0].budgets if b.action == "full@q8_0")
    assert first.kv_fraction == pytest.approx(q8, rel=1e-12)
    assert r.best is None or r.best.action.startswith("full@")
