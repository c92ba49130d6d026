"""Aggregate prediction: ridge, observations, CV selection, equivalence, cohort checks."""

import re

import numpy as np
import pandas as pd
import pytest

from kvdrift.analysis.observations import document_observations, observation_types
from kvdrift.analysis.predict import (
    ActionContrast,
    assign_folds,
    cross_validate,
    equivalence,
    evaluate,
    parse_contrast,
    predict_rows,
    predict_study,
    select,
)
from kvdrift.analysis.ridge import fit_ridge

FIXED, WINDOW = observation_types(2)
C = ActionContrast("a", "b")


def test_ridge_matches_the_closed_form_with_an_unpenalised_intercept():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3)) * [1.0, 5.0, 0.1] + [0.0, 2.0, -1.0]
    X = np.column_stack([X, np.full(30, 7.0)])  # a constant column contributes nothing
    y = X[:, 0] - 0.3 * X[:, 1] + rng.normal(size=30)
    fit = fit_ridge(X, y, alpha=10.0)
    # Closed form on the augmented design [1, Z]: penalty diag(0, 10, 10, 10, 10).
    centre, scale = X.mean(0), X.std(0)
    scale[scale == 0] = 1.0
    A = np.column_stack([np.ones(30), (X - centre) / scale])
    theta = np.linalg.solve(A.T @ A + np.diag([0.0, 10, 10, 10, 10]), A.T @ y)
    X_new = rng.normal(size=(5, 4))
    A_new = np.column_stack([np.ones(5), (X_new - centre) / scale])
    np.testing.assert_allclose(fit.predict(X_new), A_new @ theta, rtol=1e-10)
    assert fit.intercept == pytest.approx(y.mean()) and fit.coef[3] == 0.0
    # An unpenalised intercept: however large alpha, predictions shrink to the mean, not 0.
    np.testing.assert_allclose(fit_ridge(X, y + 100, alpha=1e12).predict(X_new),
                               y.mean() + 100, rtol=1e-6)


def _records(docs, actions=("a", "b"), K=2, H=4, model="m", seed=0, rate=0.4):
    """Synthetic rollout records: random mismatches; EOS on X from a random position."""
    rng = np.random.default_rng(seed)
    steps, reps = [], []
    for doc, stratum in docs:
        for action in actions:
            for k in range(K):
                m = rng.random(H) < rate
                delta = np.clip(0.7 * m + 0.2 * rng.random(H), 0.0, 1.0)
                eos_from = rng.integers(1, 2 * H)
                tau = int(np.argmax(m)) + 1 if m.any() else 0
                key = dict(model=model, doc_id=doc, stratum=stratum, action=action, replicate=k)
                for t in range(1, H + 1):
                    steps.append(key | dict(t=t, mismatch=bool(m[t - 1]),
                                            delta=float(delta[t - 1]), x_eos=t >= eos_from,
                                            y_eos=False))
                reps.append(key | dict(estimator="rollout", horizon=H, risk=m.mean(),
                                       fixed_risk=rng.random(), tau=tau))
    return pd.DataFrame(steps), pd.DataFrame(reps)


def test_document_observations_hand_values():
    key = dict(model="m", doc_id="d", stratum="s", action="a")
    mism = [[0, 1, 1, 0], [0, 0, 0, 1]]
    x_eos = [[0, 1, 1, 1], [0, 0, 0, 0]]
    steps = pd.DataFrame([key | dict(replicate=k, t=t + 1, mismatch=bool(mism[k][t]),
                                     x_eos=bool(x_eos[k][t]), y_eos=False)
                          for k in range(2) for t in range(4)])
    reps = pd.DataFrame([key | dict(replicate=0, estimator="rollout", horizon=4, risk=0.5,
                                    fixed_risk=0.1, tau=2),
                         key | dict(replicate=1, estimator="rollout", horizon=4, risk=0.25,
                                    fixed_risk=0.3, tau=4)])
    row = document_observations(steps, reps, window=2).iloc[0]
    assert row["R"] == pytest.approx(0.375) and row["F"] == pytest.approx(0.2)
    assert row["mismatch_W"] == pytest.approx((1 / 4 + 0) / 2)   # (1/H) sum_{t<=2} I_t
    assert row["flat_W"] == pytest.approx((1 / 2 + 0) / 2)       # (1/W) sum_{t<=2} I_t
    assert row["diverged_W"] == 0.5 and row["eos_x_W"] == 0.5 and row["eos_y_W"] == 0.0


def test_folds_are_round_robin_within_sorted_strata():
    ids = np.array(["d3", "d1", "d2", "e1", "e2"])
    strata = np.array(["x", "x", "x", "y", "y"])
    np.testing.assert_array_equal(assign_folds(ids, strata, 3), [2, 0, 1, 0, 1])


def _rows(n_docs, rule, seed=0, strata=("s1", "s2")):
    """Rows (doc, action) with an observation F and a target R = rule(F, stratum, action)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_docs):
        stratum = strata[i % len(strata)]
        for action in ("a", "b"):
            F = rng.uniform(0.05, 0.6)
            rows.append(dict(model="m", doc_id=f"d{i:03d}", stratum=stratum, action=action,
                             F=F, R=rule(F, stratum, action)))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("rule, winner", [
    (lambda F, s, a: F, "flat"),                                            # R is F itself
    (lambda F, s, a: {"s1": 0.2, "s2": 0.5}[s] + (a == "a") * 0.1, "cell_mean"),  # F is noise
    (lambda F, s, a: 0.1 + 0.5 * F, "ridge"),                               # R linear in F
])
def test_cross_validation_selects_the_predictor_that_must_win(rule, winner):
    mse = cross_validate(_rows(60, rule), FIXED, C)
    assert select(mse) == winner
    assert mse[winner] < 0.5 * min(v for k, v in mse.items() if k != winner)
    if winner in ("flat", "cell_mean"):
        assert mse[winner] == pytest.approx(0.0, abs=1e-24)


def _cells(r, strata=("s1", "s2"), actions=("a", "b")):
    """Stratum x action cell indicators, stratum-major (predict's design)."""
    return [((r["stratum"] == s) & (r["action"] == a)).to_numpy(float)
            for s in strata for a in actions]


def test_ridge_predictor_uses_stratum_by_action_cells_plus_features():
    rows = _rows(10, lambda F, s, a: 0.1 + F * (s == "s1") + 0.05 * (a == "a"), seed=3)
    train, test = rows.iloc[:14], rows.iloc[14:]
    got = predict_rows("ridge", train, test, FIXED)

    def design(r):
        return np.column_stack(_cells(r) + [r["F"].to_numpy(float)])

    want = fit_ridge(design(train), train["R"].to_numpy(), alpha=10.0).predict(design(test))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_unseen_strata_get_the_average_over_training_strata():
    rows = _rows(10, lambda F, s, a: 0.1 + 0.3 * (s == "s1") + 0.2 * F, seed=4)
    test = rows.iloc[:2].assign(stratum="new")
    got = predict_rows("ridge", rows, test, FIXED)
    # the model is affine: the average of the test rows placed in each training stratum
    each = [predict_rows("ridge", rows, test.assign(stratum=s), FIXED) for s in ("s1", "s2")]
    np.testing.assert_allclose(got, np.mean(each, axis=0), rtol=1e-12)
    cell = predict_rows("cell_mean", rows, test, FIXED)  # falls back to the action's mean
    np.testing.assert_allclose(cell, rows.groupby("action")["R"].mean()[["a", "b"]].to_numpy())


def test_select_breaks_ties_in_listed_order():
    assert select({"cell_mean": 0.1, "flat": 0.1, "ridge": 0.2}) == "cell_mean"


@pytest.mark.parametrize("lo, hi, decision", [
    (-0.019, 0.02, "Equivalent"), (0.021, 0.05, "Not equivalent"),
    (-0.08, -0.03, "Not equivalent"), (0.01, 0.03, "Unresolved"), (-0.03, 0.03, "Unresolved"),
])
def test_equivalence_decision(lo, hi, decision):
    assert equivalence(lo, hi, 0.02) == decision


def _shifted(rows, shift):
    """Evaluation rows with R = F + shift(doc) on action a (so flat's error is the shift)."""
    out = rows.copy()
    out["doc_id"] = "e" + out["doc_id"]
    extra = out["doc_id"].map(shift) * (out["action"] == "a")
    out["R"] = out["F"] + extra
    return out


@pytest.mark.parametrize("errors, decision, estimate", [
    ({"s1": [0.01, 0.01], "s2": [0.01] * 4}, "Equivalent", 0.01),
    # Strata weigh equally: (0.06 + 0.04) / 2, not the document mean 0.0467.
    ({"s1": [0.06, 0.06], "s2": [0.04] * 4}, "Not equivalent", 0.05),
    ({"s1": [0.0, 0.04] * 5}, "Unresolved", 0.02),
    # MAE: (0.06 + 0.0) / 2 = 0.03 with strata equal, 0.02 with documents equal.
    ({"s1": [0.06, 0.06], "s2": [0.0] * 4}, "Not equivalent", 0.03),
])
def test_evaluation_error_and_decision_at_each_outcome(errors, decision, estimate):
    dev = _rows(12, lambda F, s, a: F)  # flat is exact on development documents
    shift, ev_rows = {}, []
    for stratum, errs in errors.items():
        for i, e in enumerate(errs):
            doc = f"{stratum}-{i}"
            shift["e" + doc] = e
            for action in ("a", "b"):
                ev_rows.append(dict(model="m", doc_id=doc, stratum=stratum, action=action,
                                    F=0.3 + 0.01 * i, R=0.0))
    ev = _shifted(pd.DataFrame(ev_rows), shift)
    out = evaluate(dev, ev, FIXED, C, margin=0.02, alpha=0.05, draws=2000, seed=0).to_json()
    assert out["selected"] == "flat" and out["decision"] == decision
    assert out["error"]["estimate"] == pytest.approx(estimate)
    # MAE and RMSE weigh strata equally, as the error estimate does; the *_documents ones
    # weigh every document equally.
    per_stratum = [np.asarray(v) for v in errors.values()]
    all_errors = np.concatenate(per_stratum)
    assert out["mae"] == pytest.approx(np.mean([np.abs(v).mean() for v in per_stratum]))
    assert out["rmse"] == pytest.approx(np.sqrt(np.mean([(v ** 2).mean() for v in per_stratum])))
    assert out["mae_documents"] == pytest.approx(np.abs(all_errors).mean())
    assert out["rmse_documents"] == pytest.approx(np.sqrt((all_errors ** 2).mean()))
    # Supporting contrasts: the flat gap is F(a) - F(b) = 0, so full minus fixed = full gap.
    sup = out["supporting"]
    assert sup["fixed_history_gap"]["estimate"] == pytest.approx(0.0)
    assert sup["full_horizon_gap"]["estimate"] == pytest.approx(estimate)
    assert sup["full_minus_fixed"]["estimate"] == pytest.approx(estimate)


def test_predictions_are_clipped_before_the_contrast():
    # Flat reads F = 1.4 for a and 0.9 for b: clipped, the predicted contrast is 0.1, not 0.5.
    dev = _rows(12, lambda F, s, a: F)
    ev = pd.DataFrame([dict(model="m", doc_id=f"e{i}", stratum="s1", action=a, F=F, R=R)
                       for i in range(3) for a, F, R in (("a", 1.4, 0.9), ("b", 0.9, 0.9))])
    out = evaluate(dev, ev, FIXED, C, margin=0.02, alpha=0.05, draws=200, seed=0).to_json()
    assert out["selected"] == "flat"
    assert out["error"]["estimate"] == pytest.approx(0.0 - 0.1)


def test_predict_study_end_to_end_on_synthetic_records():
    dev = _records([(f"d{i}", f"s{i % 2}") for i in range(8)], seed=1)
    ev = _records([(f"e{i}", f"s{i % 2}") for i in range(4)], seed=2)
    out = predict_study(dev, ev, "a - b", window=2, draws=200).to_json()
    assert out["cells"] == 2 and out["alpha_adjusted"] == pytest.approx(0.025)
    [model] = out["models"]
    assert [o["observation"] for o in model["observations"]] == ["fixed_history", "positions"]
    for o in model["observations"]:
        assert o["selected"] in ("cell_mean", "flat", "ridge")
        assert o["error"]["lo"] <= o["error"]["estimate"] <= o["error"]["hi"]
        assert o["decision"] in ("Equivalent", "Not equivalent", "Unresolved")
        assert 0 <= o["mae"] <= o["rmse"]
    # the bootstrap seed: 0 by default and passed to every cell (eight documents per
    # stratum, so the percentile intervals move with it)
    wide = _records([(f"e{i}", f"s{i % 2}") for i in range(16)], seed=3)
    default = predict_study(dev, wide, "a - b", window=2, draws=200).to_json()
    assert predict_study(dev, wide, "a - b", window=2, draws=200, seed=0).to_json() == default
    other = predict_study(dev, wide, "a - b", window=2, draws=200, seed=1).to_json()
    assert [o["error"] for o in other["models"][0]["observations"]] != [
        o["error"] for o in default["models"][0]["observations"]]


@pytest.mark.parametrize("change, message", [
    (dict(eval_actions=("a", "c")), "the cohorts differ in actions"),
    (dict(eval_model="other"), "the cohorts differ in models"),
    (dict(contrast="a - z"), "action in contrast 'a - z' must be one of the actions of the "
                             "cohorts: a, b; got 'z'"),
    (dict(window=5), "window must be an integer within 1..H = 1..4; got 5"),
    (dict(dev_docs=5), "6-fold cross-validation needs at least 6 development documents"),
    (dict(same_docs=True), "documents must be disjoint"),
    (dict(contrast="a-b"), "cannot read 'a-b'"),
])
def test_bad_input_is_named(change, message):
    n_dev = change.get("dev_docs", 8)
    dev = _records([(f"d{i}", "s") for i in range(n_dev)])
    prefix = "d" if change.get("same_docs") else "e"
    ev = _records([(f"{prefix}{i}", "s") for i in range(3)],
                  actions=change.get("eval_actions", ("a", "b")),
                  model=change.get("eval_model", "m"))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        predict_study(dev, ev, change.get("contrast", "a - b"), window=change.get("window", 2),
                      draws=50)


def test_parse_contrast_keeps_hyphenated_names():
    assert parse_contrast(" snapkv-half  -  recent-half ") == ActionContrast("snapkv-half",
                                                                       "recent-half")


# --- boundaries, keys and wiring, by hand ------------------------------------------------------


@pytest.mark.parametrize("lo, hi, decision", [
    (-0.5, 0.5, "Equivalent"),        # touching both margins is inside
    (-0.75, -0.5, "Unresolved"),      # touching -margin from outside is not wholly outside
    (0.5, 0.75, "Unresolved"),
    (-0.75, 0.25, "Unresolved"),      # straddles -margin, ends inside
])
def test_equivalence_at_the_margins(lo, hi, decision):
    assert equivalence(lo, hi, 0.5) == decision


def test_folds_sort_ids_and_strata_as_text():
    # as text "10" < "9" and stratum "10" < "9": numeric order would differ
    folds = assign_folds(np.array([9, 10, 100, 7]), np.array([10, 10, 9, 9]), 3)
    # sorted (stratum, id) as text: (10, 10), (10, 9), (9, 100), (9, 7) -> folds 0, 1, 2, 0
    np.testing.assert_array_equal(folds, [1, 0, 2, 0])
    assert folds.dtype.kind == "i"


def test_cross_validation_with_three_folds_by_hand():
    rows = _rows(9, lambda F, s, a: {"s1": 0.2, "s2": 0.5}[s] * F + (a == "a") * 0.1, seed=5)
    mse = cross_validate(rows, FIXED, C, folds=3)
    docs = rows.drop_duplicates("doc_id")
    fold = dict(zip(docs["doc_id"], assign_folds(docs["doc_id"].to_numpy(),
                                                 docs["stratum"].to_numpy(), 3), strict=True))
    errors = []
    for doc in docs["doc_id"]:
        train = rows[rows["doc_id"].map(fold) != fold[doc]]
        test = rows[rows["doc_id"] == doc]
        cell = train.groupby(["stratum", "action"])["R"].mean()
        s = test["stratum"].iloc[0]
        r = test.set_index("action")["R"]
        errors.append((r["a"] - r["b"]) - (cell[(s, "a")] - cell[(s, "b")]))
    assert mse["cell_mean"] == pytest.approx(np.mean(np.square(errors)), rel=1e-12)
    assert mse != cross_validate(rows, FIXED, C)  # six folds differ


def test_negative_predictions_are_clipped_at_zero():
    rows = pd.DataFrame([dict(model="m", doc_id="d", stratum="s", action=a, F=F, R=0.0)
                         for a, F in (("a", -0.5), ("b", 0.2))])
    from kvdrift.analysis.predict import predicted_contrast
    assert predicted_contrast("flat", rows, rows, FIXED, C)["d"] == pytest.approx(-0.2)


def test_unknown_predictor_is_named():
    rows = _rows(2, lambda F, s, a: F)
    with pytest.raises(ValueError, match=r"^predictor must be one of cell_mean, flat, ridge; "
                                         r"got 'knn'$"):
        predict_rows("knn", rows, rows, FIXED)


def test_evaluate_reports_every_field_and_its_supporting_contrasts():
    dev = _rows(12, lambda F, s, a: F + 0.05 * (a == "a"))
    ev = _rows(6, lambda F, s, a: 0.3 * (a == "a"), seed=9)
    ev["doc_id"] = "e" + ev["doc_id"]
    for obs, names in ((FIXED, ("fixed_history_gap", "full_minus_fixed")),
                       (WINDOW, ("flat_extrapolation_gap", "full_minus_flat"))):
        rows_dev = dev.assign(**{c: dev["F"] for c in (obs.flat, *obs.features)})
        rows_ev = ev.assign(**{c: ev["F"] for c in (obs.flat, *obs.features)})
        out = evaluate(rows_dev, rows_ev, obs, C, margin=0.02, alpha=0.1, draws=300, seed=3,
                       folds=3).to_json()
        assert set(out) == {"observation", "label", "selected", "cv_mse", "error", "decision",
                            "mae", "rmse", "mae_documents", "rmse_documents", "supporting"}
        assert out["observation"] == obs.name and out["label"] == obs.label
        assert set(out["cv_mse"]) == {"cell_mean", "flat", "ridge"}
        assert out["cv_mse"] == cross_validate(rows_dev, obs, C, folds=3)
        sup = out["supporting"]
        assert set(sup) == {"full_horizon_gap", *names}
        gap, minus = (sup[n]["estimate"] for n in names)
        assert gap != pytest.approx(0.0)  # F(a) - F(b) differs per document here
        assert minus == pytest.approx(sup["full_horizon_gap"]["estimate"] - gap)
        again = evaluate(rows_dev, rows_ev, obs, C, margin=0.02, alpha=0.1, draws=300, seed=3,
                         folds=3).to_json()
        other = evaluate(rows_dev, rows_ev, obs, C, margin=0.02, alpha=0.1, draws=300, seed=4,
                         folds=3).to_json()
        assert again == out and other["error"] != out["error"]  # the seed drives the bootstrap


def _study_inputs(dev_docs=6, ev_strata=("x", "w", "y", "y", "z", "z"), H=32):
    dev = _records([(f"d{i}", "xyz"[i % 3]) for i in range(dev_docs)], H=H, seed=1)
    ev = _records([(f"e{i}", s) for i, s in enumerate(ev_strata)], H=H, seed=2)
    return dev, ev


def test_predict_study_fields_defaults_and_wiring():
    dev, ev = _study_inputs()
    calls = []
    out = predict_study(dev, ev, "a - b",
                        on_cell=lambda m, label: calls.append((m, label))).to_json()
    [model] = out.pop("models")
    assert out == {"contrast": "a - b", "window": 32, "margin": 0.02, "alpha": 0.05,
                   "alpha_adjusted": 0.025, "cells": 2, "folds": 6, "ridge_alpha": 10.0,
                   "bootstrap": 10000, "target": "tv"}
    assert calls == [("m", "fixed history (F)"), ("m", "positions 1..32")]
    observations = model.pop("observations")
    assert model == {"model": "m", "development_documents": 6, "evaluation_documents": 6,
                     "notes": ["evaluation strata with a single document (w, x) contribute no "
                               "between-document variation, so intervals understate "
                               "uncertainty"]}
    # the default target is the rollout TV; supporting contrasts at 1 - alpha (pointwise)
    d_obs = document_observations(*dev, 32)
    e_obs = document_observations(*ev, 32)
    d_obs, e_obs = d_obs.assign(R=d_obs["R_tv"]), e_obs.assign(R=e_obs["R_tv"])
    for got, obs in zip(observations, observation_types(32), strict=True):
        assert got == evaluate(d_obs, e_obs, obs, C, margin=0.02, alpha=0.025, draws=10000,
                               seed=0, support_alpha=0.05).to_json()
    # the same with every default spelled out, and folds passed through
    assert predict_study(dev, ev, "a - b", window=32, margin=0.02, alpha=0.05, draws=10000,
                         seed=0, target="tv").to_json()["models"][0]["observations"] \
        == observations
    three = predict_study(dev, ev, "a - b", draws=100, folds=3).to_json()
    assert three["folds"] == 3
    assert three["models"][0]["observations"][0]["cv_mse"] == cross_validate(
        d_obs, observation_types(32)[0], C, folds=3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(margin=0.0), "margin must be a finite number > 0; got 0.0"),
    (dict(alpha=0.0), "alpha must be within (0, 1); got 0.0"),
    (dict(alpha=1.0), "alpha must be within (0, 1); got 1.0"),
    (dict(contrast="a - a"), "'a - a' subtracts R(a) from itself, which is always 0; name two "
                             "different actions (or statistics)"),
])
def test_predict_study_settings_are_named(kwargs, message):
    dev, ev = _study_inputs(H=4)
    args = {"contrast": "a - b", "window": 2, "draws": 50, **kwargs}
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        predict_study(dev, ev, **args)


def test_cohort_refusals_name_what_differs():
    dev, ev = _study_inputs(H=4)
    cases = [
        ((dev, _records([("e0", "x")], actions=("a", "c"), H=4)), "a - b",
         "the cohorts differ in actions: development has a, b; evaluation has a, c"),
        ((dev, _records([("e0", "x")], model="n", H=4)), "a - b",
         "the cohorts differ in models: development has m; evaluation has n"),
        ((dev, ev), "a - z", "action in contrast 'a - z' must be one of the actions of the "
                             "cohorts: a, b; got 'z'"),
        ((dev, _records([("d3", "x"), ("e1", "y")], H=4)), "a - b",
         "development and evaluation documents must be disjoint; both have 1 (e.g. 'd3')"),
        ((dev, _records([("e0", "x")], H=8)), "a - b", "the cohorts have different horizons H: "
                                                       "[4, 8]"),
    ]
    for (d, e), contrast, message in cases:
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            predict_study(d, e, contrast, window=2, draws=50)
    # exactly as many development documents as folds is enough
    assert predict_study(dev, ev, "a - b", window=2, draws=50).to_json()["folds"] == 6


def test_document_observations_edges():
    key = dict(model="m", doc_id="d", stratum="s", action="a")
    mism = [[1, 1, 0], [0, 0, 1], [1, 1, 1]]  # tau = 1 and 3; replicate 2 has no record
    steps = pd.DataFrame([key | dict(replicate=k, t=t + 1, mismatch=bool(mism[k][t]),
                                     x_eos=False, y_eos=k == 1 and t == 0)
                          for k in range(3) for t in range(3)])
    reps = pd.DataFrame([key | dict(replicate=k, estimator="rollout", horizon=3, risk=r,
                                    fixed_risk=0.0, tau=tau)
                         for k, r, tau in ((0, 2 / 3, 1), (1, 1 / 3, 3))])
    row = document_observations(steps, reps, window=1).iloc[0]
    assert row["diverged_W"] == 0.5  # tau = 1 is within a window of 1
    assert row["eos_y_W"] == 0.5 and row["eos_x_W"] == 0.0
    assert row["R"] == pytest.approx(0.5) and row["mismatch_W"] == pytest.approx(1 / 6)
    assert row["flat_W"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"^window must be an integer within 1\.\.H = 1\.\.3; "
                                         r"got True$"):
        document_observations(steps, reps, window=True)
    with pytest.raises(ValueError, match=r"^prediction needs complete coupled rollouts "
                                         r"\(estimator = rollout\); this run used rollout, "
                                         r"swrb$"):
        document_observations(steps, reps.assign(estimator=["swrb", "rollout"]), window=1)
