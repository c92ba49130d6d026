"""The registry of quantities: every reader takes a new entry without another edit."""

import pytest
from test_results import _records

from kvdrift.analysis import registry
from kvdrift.analysis.endpoints import endpoint_stats, parse_endpoint
from kvdrift.analysis.plan import plan_study
from kvdrift.analysis.registry import Quantity, ratio
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.report.numbers import headline_quantities
from kvdrift.report.terminal import summary_table

# The example: the share of the risk that first mismatches carry, O_H / R.
FIRST_SHARE = Quantity("O_share", lambda m: ratio(m["occurrence"],
                                                  m["occurrence"] + m["occupation"]),
                       "%", "O<sub>H</sub> / R", "O_H/R", summary=True)


def test_the_registry_lists_each_statistic_once_in_the_json_order():
    names = [q.name for q in registry.QUANTITIES]
    assert len(names) == len(set(names))
    assert names[:3] == ["p_diverge", "mean_entry_time", "R"]
    assert endpoint_stats() == tuple(n for n in names if not n.startswith("var_"))


def test_adding_a_quantity_is_one_registry_entry(monkeypatch):
    monkeypatch.setattr(registry, "QUANTITIES", (*registry.QUANTITIES, FIRST_SHARE))
    steps, reps = _records(models=("toy",), docs=6)
    endpoint = "O_share(noisy) - O_share(clean)"
    study = analyze(steps, reps, AnalysisOptions(bootstrap=30, endpoints=(endpoint,)))
    s = study.action("toy", "noisy").scalars
    assert s["O_share"].estimate == pytest.approx(s["O"].estimate / s["R"].estimate)
    assert [e.name for e in study.endpoints] == [endpoint]           # the endpoint grammar
    assert parse_endpoint("O_share(a)").stat == "O_share"
    assert FIRST_SHARE in headline_quantities()                        # the report
    assert "O_H/R" in [str(c.header) for c in summary_table(study).columns][-1]  # terminal
    with pytest.raises(ValueError, match=r"^a plan target's statistic \(a document-level mean\) "
                                         r"must be one of .+; got 'O_share'$"):  # means only
        plan_study(reps.assign(setup_seconds=1.0, replicate_seconds=1.0),
                   "O_share(noisy)", 0.05)


def test_plan_reads_its_columns_and_limits_from_the_registry():
    q = registry.quantity("R_minus_F")
    assert q.plan == ("risk_tv", "fixed_risk") and q.rollouts_only and not q.from_steps
    assert registry.quantity("S99").from_steps


def test_an_unknown_quantity_is_named_with_what_is_allowed():
    with pytest.raises(ValueError, match=r"^quantity must be one of p_diverge, .+; got 'Q'$"):
        registry.quantity("Q")
