"""A press of the user's own, measured: ``--presses FILE`` on run, study and frontier, press
objects and an already-loaded model from Python, and a press's identity in its units.

The press is ``ValueNormPress`` of tests/my_presses.py, a ScorerPress kvpress does not have;
the model is the tiny saved Llama of conftest.py (``tiny_model_dir``).
"""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data import Document, write_jsonl

runner = CliRunner()
PRESSES = Path(__file__).with_name("my_presses.py")


@pytest.fixture(scope="module")
def docs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs") / "docs.jsonl"
    write_jsonl([Document(id=f"d{i}", prompt=f"Note {i}. " + "The cat sat on the mat. " * 12)
                 for i in range(2)], path)
    return path


def presses_file(folder: Path, old: str = "", new: str = "") -> Path:
    """tests/my_presses.py copied into ``folder`` (same file name), ``old`` replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PRESSES.name
    path.write_text(PRESSES.read_text().replace(old, new) if old else PRESSES.read_text())
    return path


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    after = result.output[result.output.index(errors[0]):]
    return " ".join(after.split())  # the error's line (wrapped by the console), and nothing after


# --- the presses file: loaded only when named, checked in one line ---------------------------

@pytest.mark.parametrize(("text", "needle"), [
    ("X = 1\n", "defines no PRESSES"),
    ("PRESSES = {'mine': 3}\n", "'mine': a builtins.int is not a kvpress press"),
    ("from kvpress import KnormPress\nPRESSES = {'mine': KnormPress}\n", "a press class, not"),
    ("from kvpress import KnormPress\nPRESSES = {'snapkv-half': KnormPress(0.5)}\n",
     "'snapkv-half' is already an action kvdrift names"),
    ("from kvpress import KnormPress\nPRESSES = {'knorm:ratio=0.5': KnormPress(0.5)}\n",
     "already an action kvdrift names"),
    ("from kvpress import KnormPress\nPRESSES = {'a,b': KnormPress(0.5)}\n", "without commas"),
    ("PRESSES = [1]\n", "PRESSES in"),
    ("PRESSES = {}\nFAMILIES = {'mine': 3}\n", "must be a function of the kept ratio"),
    ("PRESSES = {}\nFAMILIES = {'snapkv': lambda r: None}\n", "already a family kvdrift"),
    ("x = 1\nraise RuntimeError('boom')\n", "raised RuntimeError (line 2): boom"),
    ("def (:\n", "raised SyntaxError (line 1)"),
])
def test_a_bad_presses_file_is_refused_in_one_line(tmp_path, text, needle):
    from kvdrift.user_presses import load_presses_file

    path = tmp_path / "p.py"
    path.write_text(text)
    with pytest.raises(ValueError, match="^[^\n]*$") as info:
        load_presses_file(path)
    assert needle in str(info.value) and str(path) in str(info.value)


def test_the_cli_refuses_a_bad_file_or_a_missing_one_before_any_model(tmp_path):
    bad = tmp_path / "p.py"
    bad.write_text("PRESSES = {'mine': object()}\n")
    line = one_line_error(runner.invoke(app, ["run", "--presses", str(bad), "--actions", "mine",
                                              "--out", str(tmp_path / "r")]))
    assert "'mine': a builtins.object is not a kvpress press" in line
    assert not (tmp_path / "r").exists()
    line = one_line_error(runner.invoke(app, ["run", "--presses", str(tmp_path / "no.py"),
                                              "--out", str(tmp_path / "r")]))
    assert "presses file" in line and "does not exist" in line


def test_the_same_name_with_two_presses_in_one_study_is_refused(tmp_path, docs_file):
    """The TOML's presses file and --presses both define vnorm-half, differently."""
    mine = presses_file(tmp_path / "a")
    other = presses_file(tmp_path / "b", "compression_ratio=0.5", "compression_ratio=0.25")
    toml = tmp_path / "a" / "study.toml"
    toml.write_text(f'[study]\nmodels = ["x"]\nactions = ["vnorm-half"]\npresses = "{mine.name}"'
                    f'\n[[documents]]\nsource = "jsonl"\npath = "{docs_file}"\n')
    line = one_line_error(runner.invoke(app, ["study", str(toml), "--presses", str(other)]))
    assert "'vnorm-half' is given two different presses" in line
    assert "field compression_ratio 0.5 -> 0.25" in line


def test_only_press_actions_record_an_identity_so_older_stores_resume():
    from kvdrift.run.runner import RunConfig

    doc = Document("d", "a prompt")
    identity = {"class": "m.P", "fields": {"compression_ratio": 0.5}, "source": "ab"}
    plain = RunConfig(actions=("snapkv-half", "mine"))
    with_press = RunConfig(actions=("snapkv-half", "mine"), presses={"mine": identity})
    assert with_press.fingerprint(doc, "snapkv-half") == plain.fingerprint(doc)
    assert with_press.fingerprint(doc, "mine") == plain.fingerprint(doc) | {"press": identity}
    assert with_press.as_dict() == plain.as_dict()  # run.json compares no press code


# --- the command line: run, resume, refuse, recompute -------------------------------------------

def test_run_measures_a_press_of_ones_own_and_its_identity_guards_the_store(
        tiny_model_dir, docs_file, tmp_path):
    out = tmp_path / "run"
    mine = presses_file(tmp_path / "p")

    def run(presses, *extra):
        args = ["run", "--model", str(tiny_model_dir), "--docs", str(docs_file), "--actions",
                "vnorm-half,snapkv-half", "--replicates", "2", "--horizon", "4", "--out",
                str(out), "--json", *extra]
        return runner.invoke(app, args + (["--presses", str(presses)] if presses else []))

    first = run(mine)
    assert first.exit_code == 0, first.output
    rows = {r["action"]: r for r in json.loads(first.stdout[first.stdout.index("["):])}
    assert set(rows) == {"vnorm-half", "snapkv-half"}
    assert rows["vnorm-half"]["kv_fraction"] == pytest.approx(0.5, abs=0.02)
    recorded = json.loads((out / "run.json").read_text())
    assert recorded["config"]["press_actions"] == ["vnorm-half"]
    assert recorded["presses"]["vnorm-half"]["press"]["fields"] == {"compression_ratio": 0.5}
    assert "snapkv-half" not in recorded["config"].get("press_actions", [])
    files = sorted((out / "replicates").glob("vnorm-half*"))
    mtimes = [f.stat().st_mtime_ns for f in files]

    again = run(mine)  # resumes: nothing recomputed
    assert again.exit_code == 0, again.output
    assert [f.stat().st_mtime_ns for f in files] == mtimes

    line = one_line_error(run(None))  # the same name, no file: what is missing, in one line
    assert "'vnorm-half' with a press of your own" in line and "--presses FILE" in line

    edited = presses_file(tmp_path / "q", "compression_ratio=0.5", "compression_ratio=0.25")
    line = one_line_error(run(edited))
    assert "vnorm-half" in line and "its press has changed" in line
    assert "field compression_ratio 0.5 -> 0.25" in line and "--recompute" in line

    source = presses_file(tmp_path / "s", "values.norm(dim=-1)", "-values.norm(dim=-1)")
    line = one_line_error(run(source))
    assert "source of kvdrift_presses_my_presses.ValueNormPress changed" in line
    assert [f.stat().st_mtime_ns for f in files] == mtimes  # refusals touch nothing

    redone = run(source, "--recompute")
    assert redone.exit_code == 0, redone.output
    assert "recomputing it (--recompute)" in redone.output
    assert all(f.stat().st_mtime_ns != m for f, m in zip(files, mtimes, strict=True))
    snap = sorted((out / "replicates").glob("snapkv-half*"))
    assert snap and all(f.exists() for f in snap)


def test_a_study_toml_names_its_presses_file_relative_to_itself(
        tiny_model_dir, docs_file, tmp_path, monkeypatch):
    folder = tmp_path / "cfg"
    presses_file(folder)
    (folder / "study.toml").write_text(
        f'[study]\nname = "mine"\nmodels = ["{tiny_model_dir}"]\n'
        f'actions = ["vnorm-half", "full"]\nreplicates = 2\nhorizon = 3\n'
        f'presses = "my_presses.py"\n[[documents]]\nsource = "jsonl"\npath = "{docs_file}"\n')
    monkeypatch.chdir(tmp_path)  # the file is found beside the TOML, not in the cwd
    out = tmp_path / "st"
    result = runner.invoke(app, ["study", str(folder / "study.toml"), "--out", str(out),
                                 "--no-report"])
    assert result.exit_code == 0, result.output
    from kvdrift.directory import StudyDirectory

    directory = StudyDirectory(out)
    assert set(directory.records().replicates["action"]) == {"vnorm-half", "full"}
    assert directory.study.press_actions == ("vnorm-half",)  # read back: names, no code run
    assert directory.analyze(bootstrap=0).to_frame().shape[0] == 2


# --- from Python: press objects, a model already loaded, nothing written -------------------------

def _model_state(model):
    from kvdrift.lm.loading.digest import weights_digest

    return {
        "weights": weights_digest(model),
        "training": [m.training for m in model.modules()],
        "modules": [name for name, _ in model.named_modules()],
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()],
        "attributes": [sorted(vars(m)) for m in model.modules()],
        "attn": model.config._attn_implementation, "use_cache": model.config.use_cache,
        "device": str(model.device), "dtype": str(model.dtype),
    }


def test_python_measures_press_objects_on_a_loaded_model_in_memory(
        tiny_model_dir, docs_file, tmp_path, monkeypatch):
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import kvdrift

    spec = importlib.util.spec_from_file_location("my_presses_for_api", PRESSES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model.train()  # the user's own settings, all to be found again
    model.config.use_cache = False
    model.model.layers[0].register_forward_hook(lambda *a: None)
    before = _model_state(model)
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))

    mine = kvdrift.Model(model, tokenizer, "mine")
    actions = {"vnorm-half": module.ValueNormPress(compression_ratio=0.5),
               "snapkv-half": "snapkv-half"}
    seen = []
    first = kvdrift.measure(mine, actions, docs=docs_file, replicates=2, horizon=4,
                            bootstrap=0, on_unit=lambda key, skipped: seen.append(key.action))
    assert sorted(seen) == ["snapkv-half", "snapkv-half", "vnorm-half", "vnorm-half"]
    assert _model_state(model) == before
    second = kvdrift.measure(mine, actions, docs=docs_file, replicates=2, horizon=4,
                             bootstrap=0)
    assert _model_state(model) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # nothing written
    assert not any(home.iterdir())

    assert first.out is None
    table = first.to_frame().set_index("action")
    assert set(table.index) == {"vnorm-half", "snapkv-half"}
    assert (table["model"] == "mine").all()
    assert table.loc["vnorm-half", "kv_fraction"] == pytest.approx(0.5, abs=0.02)
    assert first.records.replicates.shape[0] == 2 * 2 * 2  # docs x actions x replicates
    # the same object served twice: the same records (seeded per document)
    cols = ["doc_id", "action", "replicate", "tau", "risk"]
    key = ["doc_id", "action", "replicate"]
    assert first.records.replicates[cols].sort_values(key).reset_index(drop=True).equals(
        second.records.replicates[cols].sort_values(key).reset_index(drop=True))
    html = first._repr_html_()
    assert html.count("<table") == 1 and "vnorm-half" in html and "Measurement" in html
    assert "<table" in first.analysis._repr_html_()


def test_python_actions_are_checked_in_one_line():
    from kvdrift.user_presses import from_actions

    with pytest.raises(ValueError, match="a list takes spec strings"):
        from_actions([object()])
    with pytest.raises(ValueError, match="under its own name"):
        from_actions({"mine": "snapkv-half"})
    with pytest.raises(ValueError, match="'mine': a builtins.int is not a kvpress press"):
        from_actions({"mine": 3})
    names, presses = from_actions({"snapkv-half": "snapkv-half"})
    assert names == ("snapkv-half",) and not presses
    import kvdrift

    with pytest.raises(ValueError, match="stands under its own name"):
        kvdrift.frontier({"snapkv": "recent"})
    with pytest.raises(ValueError, match="must be a transformers causal LM"):
        kvdrift.Model(object(), None, "mine")
    with pytest.raises(ValueError, match="Model name"):
        kvdrift.Model(object(), None, " ")


# --- the frontier over a family of one's own -----------------------------------------------------

@pytest.mark.slow  # ~50 s on two shared cores (a tiny model, up to 16 replicates per budget)
def test_frontier_over_a_family_from_a_presses_file_certifies(tiny_model_dir, docs_file,
                                                              tmp_path):
    out = tmp_path / "fr"
    args = ["frontier", "--model", str(tiny_model_dir), "--docs", str(docs_file),
            "--presses", str(PRESSES), "--families", "vnorm", "--measure", "R_tv <= 0.6",
            "--replicates", "4", "--max-replicates", "16", "--horizon", "3", "--out", str(out),
            "--device", "cpu", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout[result.stdout.index("{"):])["families"]["vnorm"]
    assert found["certified"] and found["certified"]["action"].startswith("vnorm:ratio=")
    stage = json.loads((out / "stages" / "01-look1" / "run.json").read_text())
    assert stage["config"]["press_actions"][0].startswith("vnorm:ratio=")
    line = one_line_error(runner.invoke(app, [a for a in args if a != str(PRESSES)
                                              and a != "--presses"]))
    assert "a family of your own needs its presses file" in line
    shutil.rmtree(out)
