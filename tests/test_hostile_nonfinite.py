"""Issue 46: a store written before non-finite values were refused (NaN ``delta`` and
``risk_tv``) is named by unit and column and refused, by the Python analysis and by
``kvdrift report``, never analysed from what is left; ``--recompute`` (the store's recompute)
repairs it."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data.document import Document
from kvdrift.directory import StudyDirectory
from kvdrift.finite import random_pair
from kvdrift.records.finite import nonfinite_counts
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import NonFiniteRecords, RunStore

DOCS = [Document(id=f"doc{i}", prompt=f"prompt {i}") for i in range(2)]
PAIR = random_pair(3, 5, seed=7, mix=0.7, eos_token_id=2)
CONFIG = RunConfig(model="finite", actions=("strong",), replicates=16, horizon=4, seed=3)


def _store(path):
    run_units(CONFIG, DOCS, lambda doc, action: PAIR, RunStore.open(path, CONFIG.as_dict()))
    return path


def _plant_nan(path, kind, column, rows, value=math.nan):
    """Overwrite ``column`` with NaN (or ``value``: None, a null) at ``rows`` in the unit file
    of doc0 (as an earlier kvdrift wrote it: same schema, same footer)."""
    target = next((path / kind).glob("*doc0*.parquet"))
    table = pq.read_table(target)
    values = table.column(column).to_pylist()
    for i in rows:
        values[i] = value
    at = table.column_names.index(column)
    table = table.set_column(at, column, pa.array(values, pa.float64()))
    pq.write_table(table, target)
    return target


@pytest.fixture
def legacy(tmp_path):
    path = _store(tmp_path / "legacy")
    _plant_nan(path, "steps", "delta", [1, 2, 5])
    _plant_nan(path, "replicates", "risk_tv", [0])
    return path


UNIT = "finite · doc0 · strong (risk_tv: 1 value)"


def test_the_python_analysis_names_the_unit_and_column_and_computes_nothing(legacy):
    with pytest.raises(NonFiniteRecords, match=(
            "legacy holds NaN, infinite or null values where numbers belong .* in unit "
            + UNIT.replace("(", r"\(").replace(")", r"\)")
            + "; nothing is computed from what is left around them: rerun the run or study "
              "command with --recompute to recompute those units$")):
        StudyDirectory(legacy).analyze(bootstrap=0)
    with pytest.raises(NonFiniteRecords, match=r"in unit finite · doc0 · strong \(delta: 3 "
                                               r"values\);"):
        StudyDirectory(legacy).store.read("steps")
    with pytest.raises(NonFiniteRecords, match=r"\(delta: 3 values\)"):  # as predict reads
        StudyDirectory(legacy).store.read("steps", ["model", "doc_id", "t", "delta"])


def test_kvdrift_report_refuses_in_one_line(legacy):
    result = CliRunner().invoke(app, ["report", str(legacy), "--bootstrap", "0"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and UNIT in lines[0]
    assert not (legacy / "report").exists()


def test_resuming_refuses_and_recompute_repairs(legacy, tmp_path):
    with pytest.raises(ValueError, match=(
            "unit finite · doc0 · strong in .* is not mixed in: it holds NaN, infinite or null "
            r"values where numbers belong \(delta: 3 values, risk_tv: 1 value; written by an "
            "earlier kvdrift\\)")):
        run_units(CONFIG, DOCS, lambda doc, action: PAIR, RunStore.open(legacy, CONFIG.as_dict()))
    notes = []
    store = RunStore.open(legacy, CONFIG.as_dict(), recompute=True, notice=notes.append)
    assert run_units(CONFIG, DOCS, lambda doc, action: PAIR, store) == 1  # doc0 alone
    assert len(notes) == 1 and "recomputing it (--recompute)" in notes[0]
    clean = _store(tmp_path / "clean")
    for kind in ("steps", "replicates"):
        repaired = RunStore(legacy).read(kind).sort_by([("doc_id", "ascending")])
        fresh = RunStore(clean).read(kind).sort_by([("doc_id", "ascending")])
        for column in ("delta", "risk_tv"):
            if column in fresh.column_names:
                assert repaired.column(column).equals(fresh.column(column))


def test_nan_where_the_schema_allows_it_is_not_counted():
    table = pa.table({"estimator": ["swrb", "rollout", "rollout"],
                      "delta": [math.nan, 0.5, math.inf], "kl": [math.inf, 0.1, 0.2],
                      "scan_tv": [0.1, None, 0.2]})
    assert nonfinite_counts("steps", table) == {"delta": 1}
    reps = pa.table({"estimator": ["rollout"], "risk": [math.nan],
                     "observed": pa.array([[0.1, math.nan]], pa.list_(pa.float64())),
                     "lost_mass": [math.nan]})
    assert nonfinite_counts("replicates", reps) == {"risk": 1, "observed": 1}
    assert pc.sum(pc.is_nan(reps.column("lost_mass"))).as_py() == 1  # allowed: no divergence


@pytest.fixture
def legacy_nulls(tmp_path):
    """As ``legacy``, with nulls (not NaN) where numbers belong: S99 read 0.125 (true
    0.1875) and a resume kept the unit (issue 52)."""
    path = _store(tmp_path / "legacy")
    _plant_nan(path, "steps", "delta", [1, 2, 5], value=None)
    _plant_nan(path, "replicates", "risk_tv", [0], value=None)
    return path


def test_a_null_where_a_number_belongs_is_named_like_nan(legacy_nulls):
    with pytest.raises(NonFiniteRecords, match=r"in unit " + UNIT.replace("(", r"\(").replace(
            ")", r"\)")):
        StudyDirectory(legacy_nulls).analyze(bootstrap=0)
    with pytest.raises(NonFiniteRecords, match=r"\(delta: 3 values\)"):
        StudyDirectory(legacy_nulls).store.read("steps")
    with pytest.raises(ValueError, match=r"is not mixed in: it holds NaN, infinite or null "
                                         r"values where numbers belong \(delta: 3 values, "
                                         r"risk_tv: 1 value;"):
        run_units(CONFIG, DOCS, lambda doc, action: PAIR,
                  RunStore.open(legacy_nulls, CONFIG.as_dict()))
    result = CliRunner().invoke(app, ["report", str(legacy_nulls), "--bootstrap", "0"])
    assert result.exit_code == 2 and UNIT in result.output


def test_nulls_count_only_where_a_row_needs_a_number():
    steps = pa.table({"estimator": ["swrb", "rollout", "rollout", "swrb"],
                      "delta": [None, 0.5, None, None], "scan_tv": [0.1, None, None, None],
                      "weight": [1.0, None, None, 0.5]})
    assert nonfinite_counts("steps", steps) == {"delta": 1, "scan_tv": 1}
    assert nonfinite_counts("steps", steps.drop(["estimator"])) == {"delta": 3}
    reps = pa.table({"estimator": ["rollout", "rollout"], "risk": [0.1, None],
                     "observed": pa.array([[0.1, None], None], pa.list_(pa.float64())),
                     "risk_tv": pa.array([None, None], pa.null())})
    assert nonfinite_counts("replicates", reps) == {"risk": 1, "observed": 2, "risk_tv": 2}
