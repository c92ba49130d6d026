"""The Python API guide's example (docs/python.md) runs as written, on the embedded model."""

import os
import re
from pathlib import Path

import pandas as pd
import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "python.md"


def python_example() -> str:
    """The first ```python block of the Python API guide."""
    text = GUIDE.read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)


def test_the_example_uses_the_top_level_api_only():
    code = python_example()
    assert code.startswith("import kvdrift\n")
    calls = set(re.findall(r"kvdrift\.(\w+)\(", code))
    import kvdrift

    assert calls <= set(kvdrift.__all__)
    assert {"analyze", "load_records", "run_study", "predict", "plan", "finite_state"} <= calls


#: Tasks per family of the shipped configs the example loads, in the test: six development
#: documents (the least six-fold cross-validation takes) and three evaluation ones.
TASKS_PER_FAMILY = {"cpu-dev": 2, "cpu-eval": 1}


def fewer_tasks(shipped, folder: Path):
    """``kvdrift.shipped_config`` giving a copy of the config with fewer tasks per family."""

    def config(name: str) -> Path:
        text, found = re.subn(r"^per_stratum = \d+", f"per_stratum = {TASKS_PER_FAMILY[name]}",
                              shipped(name).read_text(encoding="utf-8"), flags=re.M)
        assert found == 1
        path = folder / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        return path

    return config


@pytest.mark.slow
def test_the_guide_python_example_runs_as_written(tmp_path, monkeypatch, capsys,
                                                   one_task_per_family):
    """Every line runs as written, on fewer documents than the docs' (same length)."""
    import kvdrift

    (tmp_path / "configs").mkdir()
    monkeypatch.setattr(kvdrift, "shipped_config",
                        fewer_tasks(kvdrift.shipped_config, tmp_path / "configs"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(python_example(), "docs/python.md", "exec"), namespace)  # noqa: S102
    # What it printed is what it says it computes.
    table, analysis = namespace["table"], namespace["analysis"]
    assert isinstance(table, pd.DataFrame)
    assert sorted(table["action"]) == ["recent-half", "snapkv-half"]
    assert (table["R_lo"] <= table["R"]).all() and (table["R"] <= table["R_hi"]).all()
    first = analysis.to_json()["actions"][0]
    assert first["scalars"]["R"]["estimate"] == table.set_index("action").loc[first["action"], "R"]
    for name in ("py-demo", "py-dev", "py-eval"):
        assert (tmp_path / "runs" / name / "run.json").is_file()
    assert {name: kvdrift.load_records(tmp_path / "runs" / name).replicates["doc_id"].nunique()
            for name in ("py-demo", "py-dev", "py-eval")} == {"py-demo": 3, "py-dev": 6,
                                                               "py-eval": 3}
    assert namespace["prediction"].to_frame().shape[0] == 2  # fixed history, positions
    frame, records = namespace["frame"], namespace["records"]
    assert len(frame) == len(records.steps) and frame["x_text"].map(type).eq(str).all()
    assert "smollm2" in capsys.readouterr().out
    assert os.environ["OMP_WAIT_POLICY"]  # set on import kvdrift
