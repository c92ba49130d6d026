"""The language-model commands end to end (run, study, report) on a tiny saved model.

The model (``tiny_model_dir`` in conftest.py) is a 2-layer random Llama saved with the
embedded SmolLM2 tokenizer, so the commands take the same path as with any local model, in
seconds.
"""

import json
import re

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
        (["--replicates", "0"], "--replicates must be an integer >= 1"),
        (["--estimator", "magic"], "error: estimator must be one of rollout, swrb; got 'magic'"),
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


def test_swrb_tables_off_a_terminal(tiny_model_dir, docs_file, tmp_path, monkeypatch):
    """Piped output (80 columns): names and numbers whole, F not measured, C_H's SWRB note."""
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "swrb"
    args = ["run", "--model", str(tiny_model_dir), "--docs", str(docs_file), "--actions",
            "snapkv-half,recent-half", "--replicates", "3", "--horizon", "6",
            "--estimator", "swrb", "--out", str(out)]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    rows = json.loads(runner.invoke(app, [*args, "--json"]).stdout, parse_constant=_no_nan)
    text = table.stdout
    assert str(tiny_model_dir) in text  # the model path is longer than the page
    for row in rows:
        assert row["F"] is None and row["R_minus_F"] is None  # null in JSON, not measured
        for key, digits in (("R", 2), ("O", 2), ("E", 2), ("Pi", 2), ("C", 1)):
            assert f" {100 * row[key]:.{digits}f}% " in text, (key, text)
    body = [line for line in text.splitlines() if "snapkv-half" in line or "recent-half" in line]
    # tok/round(4) not measured, then Q's kv_fraction (about half the prompt cache)
    assert len(body) == 2 and all(re.search(r"— │ +0\.[45]\d\d │$", line.rstrip())
                                  for line in body), text
    assert "nan" not in text and "…" not in text
    assert "SWRB" in text and "ratio" in text and "[0, 1]" in text

    report = runner.invoke(app, ["report", str(out), "--bootstrap", "20"])
    assert report.exit_code == 0, report.output
    assert str(tiny_model_dir) in report.stdout and "…" not in report.stdout
    assert "ratio" in report.stdout and "[0, 1]" in report.stdout


def test_prompt_beyond_the_context_window_is_refused_before_any_unit(tiny_model_dir, tmp_path):
    docs = tmp_path / "long.jsonl"
    write_jsonl([Document(id="fits", prompt="The cat sat on the mat. " * 20),
                 Document(id="too-long", prompt="The cat sat on the mat. " * 800)], docs)
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--docs", str(docs),
                                 "--actions", "snapkv-half", "--replicates", "2",
                                 "--horizon", "4", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "'too-long'" in result.output and "context window of 4096" in result.output
    assert "Traceback" not in result.output
    assert not (out / "steps").exists() or not any((out / "steps").iterdir())  # no unit ran


def test_study_compares_every_kind_of_press(tiny_model_dir, docs_file, tmp_path):
    # head-adaptive, per-layer, chained and decode-time eviction in one paired study
    actions = ["adakv-snapkv:ratio=0.5", "pyramidkv:ratio=0.5", "snapkv:ratio=0.8+knorm:ratio=0.5",
               "decoding-knorm:interval=2,target=30"]
    config = tmp_path / "study.toml"
    config.write_text(f"""
[study]
name = "presses"
models = ["{tiny_model_dir}"]
actions = {json.dumps(actions)}
replicates = 2
horizon = 6
depths = [2]
estimator = "swrb"

[[documents]]
source = "jsonl"
path = "{docs_file}"

[analysis]
bootstrap = 50
endpoints = ["R(decoding-knorm:interval=2,target=30) - R(adakv-snapkv:ratio=0.5)"]
""")
    out = tmp_path / "study"
    result = runner.invoke(app, ["study", str(config), "--out", str(out)])
    assert result.exit_code == 0, result.output
    analysis = json.loads((out / "report" / "analysis.json").read_text())
    assert sorted(a["action"] for a in analysis["actions"]) == sorted(actions)
    assert all(a["documents"] == 4 for a in analysis["actions"])
    assert analysis["endpoints"][0]["name"].startswith("R(decoding-knorm")
    assert (out / "report" / "report.html").exists()


QUANTIZED = ("full", "kivi:bits=4", "gguf:k=q8_0,v=q8_0", "snapkv:ratio=0.5+kivi:bits=4")


@pytest.mark.parametrize("estimator", ["rollout", "swrb"])
def test_quantization_actions_run_store_and_analyse(tiny_model_dir_hd64, docs_file, tmp_path,
                                                     estimator):
    # issue 22: both estimators with KIVI, a llama.cpp cache type and a chain, end to end
    out = tmp_path / estimator
    result = runner.invoke(app, [
        "run", "--model", str(tiny_model_dir_hd64), "--docs", str(docs_file), "--actions",
        ",".join(QUANTIZED), "--replicates", "2", "--horizon", "5", "--estimator", estimator,
        "--device", "cpu", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["action"]: r for r in json.loads(result.stdout, parse_constant=_no_nan)}
    assert set(rows) == set(QUANTIZED)
    assert rows["full"]["R"] == 0 and rows["full"]["kv_fraction"] == 1
    # float32 model: a q8_0 entry is 34 bytes per 32 elements of 4 bytes, every entry
    assert rows["gguf:k=q8_0,v=q8_0"]["kv_fraction"] == pytest.approx(34 / 128)
    assert 0 < rows["kivi:bits=4"]["kv_fraction"] < 1
    assert rows["snapkv:ratio=0.5+kivi:bits=4"]["kv_fraction"] < 0.5
    reps = pq.read_table(out / "replicates").to_pandas()
    assert reps["estimator"].unique().tolist() == [estimator]
    report = runner.invoke(app, ["report", str(out), "--bootstrap", "20"])
    assert report.exit_code == 0, report.output
    analysis = json.loads((out / "report" / "analysis.json").read_text())
    for entry in analysis["actions"]:
        # by hand: one value per document, strata (short, long) weighed equally
        unit = reps[reps["action"] == entry["action"]].groupby("doc_id").first()
        want = unit.groupby("stratum")[["kv_bytes", "kv_fraction"]].mean().mean()
        assert entry["kv_bytes"] == pytest.approx(want["kv_bytes"])
        assert entry["kv_fraction"] == pytest.approx(want["kv_fraction"])
        assert entry["kv_fraction"] == pytest.approx(rows[entry["action"]]["kv_fraction"])
        assert entry["scalars"]["R"]["estimate"] == pytest.approx(rows[entry["action"]]["R"])
    assert (out / "report" / "figures" / "risk_memory.png").exists()
    assert "kv_fraction" in (out / "report" / "report.html").read_text()
