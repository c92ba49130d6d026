"""The README's "Measure your own press" runs as written: its presses file, its `kvdrift run`
line and its Python example (on the embedded model, at a tiny size)."""

import re
import shlex
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def section() -> str:
    text = README.read_text(encoding="utf-8")
    return text.split("\n## Measure your own press\n", 1)[1].split("\n## ", 1)[0]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", section(), flags=re.S)


def commands() -> dict[str, list[str]]:
    """The bash block's commands by subcommand, as argument lists (after ``kvdrift``)."""
    out = {}
    for line in blocks("bash")[0].strip().splitlines():
        words = shlex.split(line)
        assert words[0] == "kvdrift"
        out[words[1]] = words[1:]
    return out


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_presses_file_defines_what_the_commands_name(tmp_path):
    from kvpress import ScorerPress

    from kvdrift.frontier_search.families import parse_family
    from kvdrift.lm.actions.spec import parse_action
    from kvdrift.user_presses import load_presses_file

    presses_file, example = blocks("python")
    assert presses_file.startswith("# my_presses.py\n")
    assert len(presses_file.strip().splitlines()) <= 20  # a press in a dozen lines or so
    path = tmp_path / "my_presses.py"
    path.write_text(presses_file)
    user = load_presses_file(path)
    assert all(isinstance(p, ScorerPress) for p in user.presses.values())
    run, frontier = commands()["run"], commands()["frontier"]
    assert option(run, "--presses") == option(frontier, "--presses") == path.name
    for name in option(run, "--actions").split(","):
        assert name in user.presses or parse_action(name)
    for name in option(frontier, "--families").split(","):
        assert name in user.families or parse_family(name)
    assert user.family_press("vnorm", 0.25).compression_ratio == pytest.approx(0.75)
    import kvdrift

    calls = set(re.findall(r"kvdrift\.(\w+)\(", example))
    assert calls and calls <= set(kvdrift.__all__)


@pytest.mark.slow
def test_the_readme_press_runs_as_written(tmp_path, monkeypatch, capsys, one_task_per_family):
    """Both run as written, on three of the six default documents."""
    import kvdrift
    from kvdrift.directory import StudyDirectory

    presses_file, example = blocks("python")
    (tmp_path / "my_presses.py").write_text(presses_file)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # a notebook imports from its own folder
    from typer.testing import CliRunner

    from kvdrift.cli import app

    run = commands()["run"]
    result = CliRunner().invoke(app, run)
    assert result.exit_code == 0, result.output
    records = StudyDirectory(tmp_path / option(run, "--out")).records()
    assert set(records.replicates["action"]) == {"vnorm-half", "snapkv-half"}
    assert records.replicates["doc_id"].nunique() == 3

    namespace: dict = {}
    exec(compile(example, "README.md (Measure your own press)", "exec"), namespace)  # noqa: S102
    measured = namespace["result"]
    from kvdrift.measurement import Measurement

    assert isinstance(measured, Measurement) and isinstance(namespace["mine"], kvdrift.Model)
    table = measured.to_frame().set_index("action")
    assert set(table.index) == {"vnorm-half", "snapkv-half"}
    assert (table["kv_fraction"] < 0.51).all() and measured.out is None
    assert measured.records.replicates["doc_id"].nunique() == 3
    assert "<table" in measured._repr_html_()
    assert "vnorm-half" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == [
        "my_presses.py", "runs"]  # the Python example wrote nothing
    sys.modules.pop("my_presses", None)
