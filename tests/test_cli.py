"""The command line: JSON output shape and one-line errors for bad input."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.estimate import coupled_rollouts, swrb
from kvdrift.finite import exact, paper_system

runner = CliRunner()


def _recomputed_system(c, systems, replicates, horizon=3, seed=0):
    """One system of the finite-state check, recomputed from the estimators directly.

    Independent of finite_study's arithmetic: the variance ratio is naive over SWRB (per
    replicate, ddof=1), and SWRB's evaluations are the full scan (paper systems have
    e < 1 everywhere, so every position is scanned) plus the continuation after J.
    """
    pair = paper_system(c, systems, horizon, seed)
    naive = coupled_rollouts(pair, replicates, horizon, seed=seed * 1_000_003 + 2 * c)
    branch = swrb(pair, replicates, horizon, seed=seed * 1_000_003 + 2 * c + 1)
    d_h = naive.mismatch.double().sum(dim=1).numpy() / horizon
    z = branch.z_R.numpy()
    J = branch.J.numpy()
    return {"exact": exact(pair).R, "naive_mean": d_h.mean(), "swrb_mean": z.mean(),
            "naive_se": d_h.std(ddof=1) / np.sqrt(replicates),
            "swrb_se": z.std(ddof=1) / np.sqrt(replicates),
            "var_ratio": d_h.var(ddof=1) / z.var(ddof=1),
            "naive_evaluations": replicates * horizon,
            "swrb_evaluations": replicates * horizon + int((horizon - J[J > 0]).sum())}


def test_finite_state_json_reports_the_computed_values(tmp_path):
    fig = tmp_path / "fig.png"
    result = runner.invoke(app, ["finite-state", "--systems", "3", "--replicates", "64",
                                 "--json", "--figure", str(fig)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["systems"]) == 3
    want = [_recomputed_system(c, 3, 64) for c in (1, 2, 3)]
    for row, w in zip(data["systems"], want, strict=True):
        for key, value in w.items():
            assert row[key] == pytest.approx(value, rel=1e-9, abs=1e-15), key
        assert row["var_ratio"] > 1  # SWRB's variance is never above the naive one's
    ratios = np.array([w["var_ratio"] for w in want])
    assert data["median_var_ratio"] == pytest.approx(np.median(ratios))
    assert data["min_var_ratio"] == pytest.approx(ratios.min())
    assert data["max_var_ratio"] == pytest.approx(ratios.max())
    cost = sum(w["swrb_evaluations"] for w in want) / sum(w["naive_evaluations"] for w in want)
    assert data["cost_ratio"] == pytest.approx(cost)
    assert cost > 1  # the continuation is counted
    naive_var = sum(w["naive_se"] ** 2 for w in want)
    swrb_var = sum(w["swrb_se"] ** 2 for w in want)
    assert data["advantage"] == pytest.approx(naive_var / swrb_var / cost)
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_finite_state_table_prints_the_computed_summary(tmp_path):
    result = runner.invoke(app, ["finite-state", "--systems", "2", "--replicates", "16",
                                 "--figure", str(tmp_path / "f.png")])
    assert result.exit_code == 0, result.output
    want = [_recomputed_system(c, 2, 16) for c in (1, 2)]
    median = float(np.median([w["var_ratio"] for w in want]))
    cost = sum(w["swrb_evaluations"] for w in want) / (2 * 16 * 3)
    lines = {line.split("│")[1].strip(): line for line in result.stdout.splitlines()
             if line.count("│") >= 3}
    # Row "median variance ratio": kvdrift's column shows the computed value, then the paper's.
    cells = [c.strip() for c in lines["median variance ratio"].split("│")[1:-1]]
    assert cells == ["median variance ratio", f"{median:.1f}", "52.7"]
    cells = [c.strip() for c in lines["kernel-pair evaluations"].split("│")[1:-1]]
    assert cells == ["kernel-pair evaluations", f"x{cost:.2f}", "x1.37"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicates", "0"], "replicates K must be an integer >= 1"),
        (["--horizon", "0"], "horizon H must be an integer >= 1"),
        (["--systems", "0"], "systems must be an integer >= 1"),
    ],
)
def test_finite_state_bad_input_is_one_line(tmp_path, args, message):
    result = runner.invoke(app, ["finite-state", *args, "--figure", str(tmp_path / "f.png")])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("model", ["no/such-model", "missing-dir/"])
def test_run_with_unknown_model_is_one_line(tmp_path, monkeypatch, model):
    """An unknown or unreachable model: one line naming it and what is allowed, no store left."""
    monkeypatch.setenv("COLUMNS", "80")  # the line must not be wrapped either
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--model", model, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"cannot load model {model!r}" in lines[0]
    assert "local model directory" in lines[0] and "local cache" in lines[0]
    # the typo must not pin the output directory to a run of the wrong model
    assert not (out / "run.json").exists()


def test_run_with_a_directory_that_is_no_model(tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    result = runner.invoke(app, ["run", "--model", str(empty), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"cannot load model {str(empty)!r}" in " ".join(result.output.split())


def _finite_store(path, n_docs, prefix, cohort=None, actions=("mild", "strong")):
    """A rollout store on finite pairs (seconds), optionally labelled with a cohort."""
    from kvdrift.data.document import Document
    from kvdrift.finite import random_pair
    from kvdrift.run.runner import RunConfig, run_units
    from kvdrift.run.store import RunStore

    pairs = {a: random_pair(3, 5, seed=7, mix=m, eos_token_id=2)
             for a, m in {"mild": 0.2, "strong": 0.7, "other": 0.5}.items()}
    cfg = RunConfig(model="finite", actions=actions, replicates=4, horizon=5, seed=1)
    docs = [Document(id=f"{prefix}{i}", prompt="p", stratum=f"s{i % 2}") for i in range(n_docs)]
    store = RunStore.open(path, cfg.as_dict() | ({"cohort": cohort} if cohort else {}))
    run_units(cfg, docs, lambda doc, action: pairs[action], store)
    return str(path)


@pytest.fixture(scope="module")
def cohorts(tmp_path_factory):
    root = tmp_path_factory.mktemp("cohorts")
    return (_finite_store(root / "dev", 8, "d", "development"),
            _finite_store(root / "eval", 4, "e", "evaluation"))


def test_predict_json_and_table(cohorts):
    dev, ev = cohorts
    args = ["predict", dev, ev, "--contrast", "strong - mild", "--window", "3",
            "--bootstrap", "200"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    [model] = data["models"]
    for o in model["observations"]:
        assert set(o) >= {"selected", "error", "decision", "mae", "rmse", "supporting"}
        assert set(o["error"]) == {"estimate", "lo", "hi", "level"}
        assert o["error"]["level"] == pytest.approx(1 - 0.05 / 2)  # family: 2 cells
        assert {iv["level"] for iv in o["supporting"].values()} == {0.95}  # pointwise
    assert data["target"] == "tv" and data["bootstrap"] == 200
    report = Path(dev).parent / "table4.html"
    assert runner.invoke(app, [*args, "--report", str(report)]).exit_code == 0
    assert "Table 4" in report.read_text(encoding="utf-8")
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "positions 1..3" in table.stdout and "fixed history" in table.stdout


def test_plan_json_and_table(cohorts):
    dev, _ = cohorts
    args = ["plan", dev, "--target", "R(strong) - R(mild)", "--halfwidth", "0.05"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    [model] = json.loads(result.stdout)["models"]
    assert model["recommended"]["halfwidth"] <= 0.05
    assert model["comparison"]["cheaper"] in ("rollout", "swrb")
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "cheaper under equal variance" in table.stdout


def test_plan_sizes_s99_from_step_records_for_one_of_several_endpoints(cohorts):
    dev, _ = cohorts
    args = ["plan", dev, "--target", "S99(strong) - S99(mild)", "--halfwidth", "0.05",
            "--endpoints", "4"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["endpoints"] == 4 and data["level"] == pytest.approx(1 - 0.05 / 4)
    assert data["models"][0]["recommended"]["halfwidth"] <= 0.05
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "Bonferroni" in table.stdout


@pytest.mark.parametrize("args, message", [
    (["--contrast", "strong - full", "--window", "3"],
     "action in contrast 'strong - full' must be one of the actions of the cohorts: mild, strong; "
     "got 'full'"),
    (["--contrast", "strong - mild", "--window", "6"], "window must be an integer within 1..H"),
    (["--contrast", "strong - mild", "--swap"], "is the evaluation cohort"),
])
def test_predict_bad_input_is_one_line(cohorts, args, message):
    dev, ev = cohorts
    if "--swap" in args:
        args.remove("--swap")
        dev, ev = ev, dev
    result = runner.invoke(app, ["predict", dev, ev, *args, "--bootstrap", "50"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_predict_refuses_cohorts_with_other_actions_and_too_few_documents(tmp_path, cohorts):
    dev, ev = cohorts
    other = _finite_store(tmp_path / "other", 4, "o", actions=("mild", "other"))
    result = runner.invoke(app, ["predict", dev, other, "--contrast", "strong - mild",
                                 "--window", "3"])
    assert result.exit_code == 2 and "the cohorts differ in actions" in result.output
    small = _finite_store(tmp_path / "small", 5, "x")
    result = runner.invoke(app, ["predict", small, ev, "--contrast", "strong - mild",
                                 "--window", "3"])
    assert result.exit_code == 2
    assert "needs at least 6 development documents" in " ".join(result.output.split())
