"""The finite-state check's summary when a system is degenerate (its variance ratio undefined)."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import kvdrift.finite_study as finite_study
from kvdrift.cli import app
from kvdrift.finite_study import FiniteStudyResult, SystemResult, run_system, variance_ratio


def system(c: int, ratio: float, undefined: str | None = None) -> SystemResult:
    return SystemResult(system=c, exact=0.1, naive_mean=0.1, naive_se=0.01, swrb_mean=0.1,
                        swrb_se=0.001, var_ratio=ratio, naive_evaluations=10,
                        swrb_evaluations=13, var_ratio_undefined=undefined)


def test_variance_ratio_defined_and_undefined():
    ratio, why = variance_ratio(np.array([0.0, 1.0, 0.0, 1.0]), np.array([0.4, 0.6, 0.4, 0.6]))
    assert why is None and ratio == pytest.approx((1 / 3) / (0.04 / 3))
    ratio, why = variance_ratio(np.zeros(8), np.array([0.0, 0.01, 0.0, 0.02] * 2))
    assert math.isnan(ratio) and "never diverged" in why
    ratio, why = variance_ratio(np.full(4, 0.5), np.array([0.1, 0.2, 0.1, 0.2]))
    assert math.isnan(ratio) and "all equal" in why
    ratio, why = variance_ratio(np.array([0.0, 1.0]), np.full(2, 0.3))
    assert math.isnan(ratio) and "SWRB" in why


def test_seed_2_system_12_never_diverges():
    # With seed 2, system 12's 512 naive replicates never diverge (its mixing weight is tiny):
    # the ratio used to print as 0.0; it is undefined, with the reason.
    s = run_system(12, 24, 3, 512, seed=2)
    assert s.naive_mean == 0.0 and s.swrb_mean > 0
    assert math.isnan(s.var_ratio) and not s.informative
    assert "never diverged" in s.var_ratio_undefined


def test_summary_uses_informative_systems_only():
    result = FiniteStudyResult(
        [system(1, 10.0), system(2, math.nan, "the naive replicates never diverged"),
         system(3, 30.0), system(4, 20.0)], horizon=3, replicates=512, seed=0)
    assert result.informative == 3
    assert (result.min_var_ratio, result.median_var_ratio, result.max_var_ratio) == (10, 20, 30)
    data = json.loads(json.dumps(result.to_json()).replace("NaN", "null"))
    assert data["informative_systems"] == 3
    assert data["systems"][1]["var_ratio_undefined"] == "the naive replicates never diverged"
    none = FiniteStudyResult([system(1, math.nan, "x")], horizon=3, replicates=512, seed=0)
    assert none.informative == 0 and math.isnan(none.median_var_ratio)


def test_cli_names_undefined_systems(monkeypatch, tmp_path):
    fake = FiniteStudyResult(
        [system(1, 25.0), system(2, math.nan, "the naive replicates never diverged "
                                             "(naive variance 0)")],
        horizon=3, replicates=512, seed=2)
    monkeypatch.setattr(finite_study, "run_finite_study", lambda *a, **k: fake)
    out = CliRunner().invoke(app, ["finite-state", "--figure", str(tmp_path / "f.png")])
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "undefined*" in text and "1 of 2" in text
    assert "system 2: variance ratio undefined: the naive replicates never diverged" in text
    result = CliRunner().invoke(app, ["finite-state", "--json", "--figure",
                                      str(tmp_path / "g.png")])
    data = json.loads(result.stdout)
    assert data["systems"][1]["var_ratio"] is None and data["informative_systems"] == 1
