"""The finite-state check: each system's wiring, the study's defaults and refusals, and its summary
when a system is degenerate (its variance ratio undefined)."""

import json
import math

import numpy as np
import pytest
from messages import whole
from typer.testing import CliRunner

import kvdrift.finite.check as finite_study
from kvdrift.cli import app
from kvdrift.finite.check import FiniteStudyResult, SystemResult, run_system, variance_ratio


def system(c: int, ratio: float, undefined: str | None = None) -> SystemResult:
    return SystemResult(system=c, exact=0.1, naive_mean=0.1, naive_se=0.01, swrb_mean=0.1,
                        swrb_se=0.001, var_ratio=ratio, naive_evaluations=10,
                        swrb_evaluations=13, var_ratio_undefined=undefined)


def test_variance_ratio_defined_and_undefined():
    ratio, why = variance_ratio(np.array([0.0, 1.0, 0.0, 1.0]), np.array([0.4, 0.6, 0.4, 0.6]))
    assert why is None and ratio == pytest.approx((1 / 3) / (0.04 / 3))
    ratio, why = variance_ratio(np.zeros(8), np.array([0.0, 0.01, 0.0, 0.02] * 2))
    assert math.isnan(ratio) and why == "the naive replicates never diverged (naive variance 0)"
    ratio, why = variance_ratio(np.full(4, 0.5), np.array([0.1, 0.2, 0.1, 0.2]))
    assert math.isnan(ratio) and why == "the naive replicates are all equal (naive variance 0)"
    ratio, why = variance_ratio(np.array([0.0, 1.0]), np.full(2, 0.3))
    assert math.isnan(ratio) and why == "the SWRB replicates are all equal (SWRB variance 0)"


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


def test_run_system_wires_the_estimators_and_their_seeds():
    """Every field against direct calls: system c's naive seed is seed * 1_000_003 + 2c, SWRB's
    the next one (docs/finite-state.md), so systems and estimators never share a stream."""
    from kvdrift.estimate import coupled_rollouts, swrb
    from kvdrift.finite import exact, paper_system

    c, systems, H, K, seed = 3, 5, 4, 16, 2
    got = run_system(c, systems, H, K, seed)
    pair = paper_system(c, n_systems=systems, H=H, seed=seed)
    naive = coupled_rollouts(pair, K, H, seed=seed * 1_000_003 + 2 * c)
    branch = swrb(pair, K, H, seed=seed * 1_000_003 + 2 * c + 1)
    d_h, z = naive.mismatch.double().mean(dim=1).numpy(), branch.z_R.numpy()
    assert got.system == c and got.exact == exact(pair).R
    assert got.naive_mean == pytest.approx(d_h.mean(), rel=1e-14)
    assert got.naive_se == pytest.approx(d_h.std(ddof=1) / math.sqrt(K), rel=1e-12)
    assert got.swrb_mean == pytest.approx(z.mean(), rel=1e-14)
    assert got.swrb_se == pytest.approx(z.std(ddof=1) / math.sqrt(K), rel=1e-12)
    assert got.var_ratio == pytest.approx(d_h.var(ddof=1) / z.var(ddof=1), rel=1e-12)
    assert (got.naive_evaluations, got.swrb_evaluations) == (
        int(naive.evaluations), int(branch.evaluations.sum()))
    assert got.var_ratio_undefined is None and got.informative


def test_run_finite_study_defaults_progress_and_refusals():
    import inspect

    defaults = {k: p.default for k, p in
                inspect.signature(finite_study.run_finite_study).parameters.items()}
    # the method's protocol (docs/method.md section 11): 24 systems, 512 replicates, H = 3, seed 0
    assert defaults == {"systems": 24, "replicates": 512, "horizon": 3, "seed": 0,
                        "progress": None}
    calls = []
    with pytest.MonkeyPatch.context() as mp:  # the defaults as run, without running them
        mp.setattr(finite_study, "run_system", lambda *args: calls.append(args) or system(
            args[0], 1.0))
        protocol = finite_study.run_finite_study()
    assert calls == [(c, 24, 3, 512, 0) for c in range(1, 25)]
    assert (protocol.horizon, protocol.replicates, protocol.seed) == (3, 512, 0)
    seen = []
    result = finite_study.run_finite_study(systems=2, replicates=2, horizon=2, seed=4,
                                           progress=seen.append)
    assert seen == [1, 2] and [s.system for s in result.systems] == [1, 2]
    assert (result.horizon, result.replicates, result.seed) == (2, 2, 4)
    assert result.systems[1] == run_system(2, 2, 2, 2, seed=4)
    assert finite_study.run_finite_study(systems=1, replicates=2, horizon=1).informative <= 1
    for kwargs, message in [
        ({"systems": 0}, "systems must be an integer >= 1; got 0"),
        ({"systems": True}, "systems must be an integer >= 1; got True"),
        ({"replicates": 1}, "replicates must be an integer >= 2 (to estimate a variance); got 1"),
    ]:
        with pytest.raises(ValueError, match=whole(message)):
            finite_study.run_finite_study(**kwargs)


def test_to_json_carries_every_field_and_the_paper():
    result = FiniteStudyResult([system(1, 10.0), system(2, math.nan, "why")], horizon=3,
                               replicates=64, seed=7)
    data = result.to_json()
    first = {"exact": 0.1, "naive_mean": 0.1, "naive_se": 0.01, "swrb_mean": 0.1,
             "swrb_se": 0.001, "var_ratio": 10.0, "naive_evaluations": 10,
             "swrb_evaluations": 13, "var_ratio_undefined": None, "system": 1}
    assert data["systems"][0] == first and list(data["systems"][0])[-1] == "system"
    assert data["systems"][1]["var_ratio_undefined"] == "why"
    assert {k: v for k, v in data.items() if k != "systems"} == {
        "informative_systems": 1, "median_var_ratio": 10.0, "min_var_ratio": 10.0,
        "max_var_ratio": 10.0, "cost_ratio": 1.3, "advantage": result.advantage,
        "horizon": 3, "replicates": 64, "seed": 7, "paper": finite_study.PAPER}
    assert finite_study.PAPER == {"min_var_ratio": 11.1, "median_var_ratio": 52.7,
                                  "max_var_ratio": 289.0, "cost_ratio": 1.37, "advantage": 20.0}


def test_no_informative_system_gives_nan_without_warnings():
    import warnings

    none = FiniteStudyResult([system(1, math.nan, "x")], horizon=3, replicates=512, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not the median of an empty array
        stats = (none.min_var_ratio, none.median_var_ratio, none.max_var_ratio)
    assert all(math.isnan(v) for v in stats)
