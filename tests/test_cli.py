"""The command line: JSON output shape and one-line errors for bad input."""

import json

import pytest
from typer.testing import CliRunner

from kvdrift.cli import app

runner = CliRunner()


def test_finite_state_json(tmp_path):
    fig = tmp_path / "fig.png"
    result = runner.invoke(app, ["finite-state", "--systems", "3", "--replicates", "64",
                                 "--json", "--figure", str(fig)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) >= {"systems", "median_var_ratio", "min_var_ratio", "max_var_ratio",
                         "cost_ratio", "advantage"}
    assert len(data["systems"]) == 3
    for row in data["systems"]:
        assert set(row) >= {"exact", "naive_mean", "naive_se", "swrb_mean", "swrb_se",
                            "var_ratio"}
        assert 0 <= row["exact"] <= 1
    assert data["min_var_ratio"] <= data["median_var_ratio"] <= data["max_var_ratio"]
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_finite_state_table(tmp_path):
    result = runner.invoke(app, ["finite-state", "--systems", "2", "--replicates", "16",
                                 "--figure", str(tmp_path / "f.png")])
    assert result.exit_code == 0, result.output
    assert "median variance ratio" in result.stdout and "52.7" in result.stdout


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
