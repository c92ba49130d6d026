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
