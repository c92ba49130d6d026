"""The language-model commands end to end (run, study, report) on a tiny saved model.

The model (``tiny_model_dir`` in conftest.py) is a 2-layer random Llama saved with the
embedded SmolLM2 tokenizer, so the commands take the same path as with any local model, in
seconds.
"""

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data import Document, write_jsonl

runner = CliRunner()


@pytest.fixture(scope="module")
def docs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs") / "docs.jsonl"
    docs = [Document(id=f"d{i}", prompt=f"Document {i}. " + "The cat sat on the mat. " * (20 + i),
                     stratum="short" if i < 2 else "long") for i in range(4)]
    write_jsonl(docs, path)
    return path


def _no_nan(token):
    raise AssertionError(f"output is not strict JSON: {token}")


def run_args(model, docs, out, *extra):
    return ["run", "--model", str(model), "--docs", str(docs), "--actions",
            "full,snapkv-half,recent-half", "--replicates", "3", "--horizon", "6",
            "--depths", "2", "--out", str(out), *extra]


def test_run_writes_records_and_prints_json(tiny_model_dir, docs_file, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, run_args(tiny_model_dir, docs_file, out, "--json"))
    assert result.exit_code == 0, result.output
    rows = {r["action"]: r for r in json.loads(result.stdout, parse_constant=_no_nan)}
    assert set(rows) == {"full", "snapkv-half", "recent-half"}
    assert rows["full"]["R"] == 0 and rows["full"]["F"] == 0 and rows["full"]["p_diverge"] == 0
    steps = pq.read_table(out / "steps").to_pandas()
    assert {"model", "doc_id", "action", "replicate", "t", "x_token", "y_token", "mismatch",
            "delta", "f", "tau", "x_eos", "y_eos"} <= set(steps.columns)
    assert len(steps) == 4 * 3 * 3 * 6
    assert (steps[steps.action == "full"]["delta"] == 0).all()
    assert (steps[steps.t == 1]["delta"] == 0).all()  # first position precedes eviction
    meta = json.loads((out / "run.json").read_text())
    assert meta["config"]["replicates"] == 3 and "torch" in meta["versions"]

    # Same arguments again: nothing to redo, same table.
    again = runner.invoke(app, run_args(tiny_model_dir, docs_file, out, "--json"))
    assert again.exit_code == 0 and json.loads(again.stdout) == json.loads(result.stdout)
    assert len(pq.read_table(out / "steps")) == len(steps)

    report = runner.invoke(app, ["report", str(out), "--bootstrap", "50"])
    assert report.exit_code == 0, report.output
    html = (out / "report" / "report.html").read_text()
    assert "snapkv-half" in html and "data:image/png;base64," in html
    numbers = json.loads((out / "report" / "analysis.json").read_text())
    assert {a["action"] for a in numbers["actions"]} == set(rows)


def test_run_refuses_bad_input_in_one_line(tiny_model_dir, docs_file, tmp_path):
    cases = [
        (["--actions", "snapkv-halfish"], "snapkv-halfish"),
        (["--actions", "knorm:ratio=1.5"], "ratio"),
        (["--replicates", "0"], "replicates K must be an integer >= 1"),
        (["--estimator", "magic"], "unknown estimator"),
        (["--docs", str(tmp_path / "missing.jsonl")], "missing.jsonl"),
    ]
    for extra, message in cases:
        args = run_args(tiny_model_dir, docs_file, tmp_path / "bad", *extra)
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (extra, result.output)
        assert message in result.output and "Traceback" not in result.output


def test_study_runs_and_reports(tiny_model_dir, docs_file, tmp_path):
    config = tmp_path / "study.toml"
    config.write_text(f"""
[study]
name = "tiny"
models = ["{tiny_model_dir}"]
actions = ["snapkv-half", "recent-half"]
replicates = 2
horizon = 8
depths = [2]

[[documents]]
source = "jsonl"
path = "{docs_file}"

[[documents]]
source = "ruler"
families = ["niah_single"]
needle_types = ["number"]
lengths = [512]
per_stratum = 1

[analysis]
bootstrap = 50
endpoints = ["R(recent-half) - R(snapkv-half)"]
""")
    out = tmp_path / "study"
    result = runner.invoke(app, ["study", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "report" / "analysis.json").read_text())
    assert len(analysis["actions"]) == 2 and analysis["actions"][0]["documents"] == 5
    assert analysis["endpoints"][0]["name"] == "R(recent-half) - R(snapkv-half)"
    assert set(analysis["meta"]["documents"]) == {"short", "long", "niah_single-512"}
    assert (out / "report" / "report.html").exists()
