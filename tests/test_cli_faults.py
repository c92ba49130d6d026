"""The command line under hostile input and faults: no model's own code runs, no network is
touched, user text is printed literally, file-system and encoding errors are one line, and
the Ray driver checks the context window before any unit runs."""

import errno
import json
import os
import socket
import time

import pytest
import ray
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data import Document, load_jsonl, write_jsonl
from kvdrift.study_config import parse_study

runner = CliRunner()


def one_line(result):
    """The whole output, which must be one line."""
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def error_line(result):
    """The one error line that ends the output (after a model's loading progress, if any)."""
    lines = result.output.strip().splitlines()
    assert "Traceback" not in result.output, result.output
    assert [line for line in lines if "error:" in line] == lines[-1:], result.output
    return lines[-1]


def run_args(model, docs, out, *extra):
    return ["run", "--model", str(model), "--docs", str(docs), "--actions", "full,snapkv-half",
            "--replicates", "2", "--horizon", "4", "--out", str(out), *extra]


@pytest.fixture
def docs_file(tmp_path):
    path = tmp_path / "docs.jsonl"
    write_jsonl([Document(id=f"d{i}", prompt="The cat sat on the mat. " * 10) for i in range(2)],
                path)
    return path


# --- no remote code, no network -------------------------------------------------------------


def test_a_model_directory_with_its_own_code_never_runs_it(tmp_path, docs_file):
    """transformers would ask "Do you wish to run the custom code? [y/N]" on stdin; "y" must
    change nothing: the code is never imported and the refusal is one line."""
    model = tmp_path / "custom"
    model.mkdir()
    marker = tmp_path / "the-code-ran"
    (model / "config.json").write_text(json.dumps({
        "model_type": "kvdrift-unknown-arch", "architectures": ["EvilForCausalLM"],
        "auto_map": {"AutoConfig": "evil.EvilConfig",
                     "AutoModelForCausalLM": "evil.EvilForCausalLM"}}))
    (model / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    out = tmp_path / "run"
    result = runner.invoke(app, run_args(model, docs_file, out), input="y\ny\ny\n")
    assert result.exit_code == 2
    line = one_line(result)
    assert line == (f"error: cannot load model {str(model)!r}: it needs its own Python code "
                    "(auto_map in config.json), which kvdrift never runs (trust_remote_code="
                    "False); allowed: models whose architecture transformers implements")
    assert not marker.exists() and not (out / "run.json").exists()


def test_an_unknown_model_is_refused_at_once_without_the_network(tmp_path, monkeypatch):
    import huggingface_hub.constants

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # as if online
    attempts = []

    def no_network(*args, **kwargs):
        attempts.append(args)
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    started = time.process_time()
    result = runner.invoke(app, ["run", "--model", "no-such-model", "--out", str(tmp_path / "r")])
    elapsed = time.process_time() - started  # CPU seconds: load does not stretch them
    assert result.exit_code == 2 and attempts == []
    assert one_line(result) == (
        "error: cannot load model 'no-such-model': not a local model directory, and no hub id "
        "of that name is in the local cache; allowed: 'smollm2' (embedded), a local model "
        "directory, or a Hugging Face hub id already in the local cache (runs are offline; "
        "--allow-download or HF_HUB_OFFLINE=0 to download)")
    assert elapsed < 5


def test_downloading_is_an_explicit_opt_in(tmp_path, monkeypatch):
    from kvdrift.lm.loading.pretrained import downloads_allowed, pretrained_options

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert not downloads_allowed()
    assert downloads_allowed(allow_download=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert downloads_allowed()
    assert pretrained_options("org/model") == {"trust_remote_code": False,
                                               "local_files_only": False}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pretrained_options("org/model", allow_download=True)["local_files_only"] is False
    assert pretrained_options(tmp_path) == {"trust_remote_code": False, "local_files_only": True}
    with pytest.raises(ValueError, match="no hub id of that name is in the local cache"):
        pretrained_options("org/model")


# --- one writer per store ------------------------------------------------------------------


def test_a_second_run_on_a_locked_store_gets_one_line(tiny_model_dir, docs_file, tmp_path):
    from kvdrift.run.lock import StoreLock

    out = tmp_path / "run"
    with StoreLock(out):
        result = runner.invoke(app, run_args(tiny_model_dir, docs_file, out))
    assert result.exit_code == 2
    assert error_line(result) == (f"error: {out} is being written by another kvdrift process "
                                f"(PID {os.getpid()}); wait for it to finish, or use another "
                                "output directory")
    assert not (out / "run.json").exists()


def test_run_refuses_units_of_another_horizon_then_recomputes(tiny_model_dir, docs_file,
                                                              tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, run_args(tiny_model_dir, docs_file, out)).exit_code == 0
    meta = json.loads((out / "run.json").read_text())
    meta["config"]["horizon"] = 6
    (out / "run.json").write_text(json.dumps(meta))
    result = runner.invoke(app, run_args(tiny_model_dir, docs_file, out, "--horizon", "6"))
    assert result.exit_code == 2
    assert "it was computed with horizon H = 4, this run has horizon H = 6" in error_line(result)
    again = runner.invoke(app, run_args(tiny_model_dir, docs_file, out, "--horizon", "6",
                                        "--recompute", "--json"))
    assert again.exit_code == 0, again.output
    import pyarrow.parquet as pq

    assert set(pq.read_table(out / "replicates")["horizon"].to_pylist()) == {6}


# --- user text is printed literally -----------------------------------------------------------


def test_markup_in_ids_and_model_paths_is_printed_literally(tiny_model_dir, tmp_path):
    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id="[/x]", prompt="The cat sat on the mat. " * 10, stratum="[b]"),
                 Document(id="[bold]y", prompt="A dog ran in the park. " * 10)], docs)
    model = tmp_path / "m[red]odel"
    model.symlink_to(tiny_model_dir, target_is_directory=True)
    out = tmp_path / "run"
    result = runner.invoke(app, run_args(model, docs, out))
    assert result.exit_code == 0, result.output
    assert "[bold]y · snapkv-half" in result.output  # the progress description, literally
    assert "m[red]odel" in result.stdout  # the table's model column
    again = runner.invoke(app, run_args(model, docs, out))  # and a rerun finishes too
    assert again.exit_code == 0, again.output


def test_config_errors_keep_their_brackets(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[study]\nmodels = ["smollm2"]\nactions = ["full"]\nreplicate = 3\n'
                    '[[documents]]\nsource = "ruler"\n')
    result = runner.invoke(app, ["study", str(path)])
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith("error: key in [study] must be one of name, models, ")
    assert line.endswith("; got 'replicate'")


# --- the Ray driver checks the context window -------------------------------------------------


def test_the_ray_executor_refuses_an_overlong_document_before_any_unit(tiny_model_dir,
                                                                         tmp_path):
    from kvdrift.lm.factory import LMPairSource, driver_side

    side = driver_side(LMPairSource(str(tiny_model_dir)), in_process=False)
    assert side.context_window == 4096  # read from the config on the driver
    docs = tmp_path / "long.jsonl"
    write_jsonl([Document(id="long", prompt="word " * 4100)], docs)
    out = tmp_path / "run"
    was_running = ray.is_initialized()
    result = runner.invoke(app, run_args(tiny_model_dir, docs, out, "--executor", "ray"))
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith("error: document 'long' has ") and "context window of 4096" in line
    assert ray.is_initialized() == was_running  # refused before Ray started
    assert not list((out / "replicates").glob("*.parquet")) if out.exists() else True


# --- file-system and encoding errors, malformed files and TOML types ---------------------------


@pytest.mark.parametrize("code, reason", [(errno.ENOSPC, "No space left on device"),
                                          (errno.EROFS, "Read-only file system")])
def test_a_full_or_read_only_disk_is_one_line(tiny_model_dir, docs_file, tmp_path, monkeypatch,
                                              code, reason):
    import kvdrift.run.store as store_module

    def failing_write(table, path, **kwargs):
        raise OSError(code, reason, str(path))

    monkeypatch.setattr(store_module.pq, "write_table", failing_write)
    result = runner.invoke(app, run_args(tiny_model_dir, docs_file, tmp_path / "run"))
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"error: {tmp_path / 'run' / 'documents'}/")  # the unit's first file
    assert line.endswith(f": {reason} (errno {code})")


def test_a_damaged_run_json_is_one_line(tiny_model_dir, docs_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("[]")
    result = runner.invoke(app, run_args(tiny_model_dir, docs_file, out))
    assert result.exit_code == 2
    assert error_line(result).startswith(f"error: {out / 'run.json'} is damaged: not a JSON object")


def test_a_non_utf8_jsonl_names_the_file_and_line(tiny_model_dir, tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b'{"id": "a", "prompt": "fine"}\n{"id": "b", "prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError) as info:
        load_jsonl(path)
    assert str(info.value) == (f"{path}:2: not UTF-8 text (byte 27 of the line); JSONL files "
                               "must be UTF-8")
    result = runner.invoke(app, ["run", "--docs", str(path), "--out", str(tmp_path / "r"),
                                 "--model", str(tiny_model_dir)])
    assert result.exit_code == 2 and f"{path}:2: not UTF-8 text" in one_line(result)


def base(**study):
    return {"study": {"models": ["smollm2"], "actions": ["snapkv-half"]} | study,
            "documents": [{"source": "ruler", "lengths": [512], "per_stratum": 1}]}


@pytest.mark.parametrize("study, message", [
    (dict(depths=["a"]), "[study].depths must be a list of integers; got ['a']"),
    (dict(models=["smollm2", 3]), "[study].models must be a list of strings; got ['smollm2', 3]"),
    (dict(models=["smollm2", "smollm2"]), "[study].models lists 'smollm2' twice; each must "
                                          "appear once"),
    (dict(temperature=float("inf")), "temperature must be a finite number >= 0 (0 = greedy); "
                                     "got inf"),
    (dict(name="../../x"), "[study].name must be one directory name (any script, spaces and "
                           "punctuation; no '/', '\\', control characters, '.' or '..'; at most "
                           "255 bytes); got '../../x'"),
    (dict(name="a/b"), "[study].name must be one directory name"),
    (dict(name=".."), "[study].name must be one directory name"),
    (dict(name="a\x1b[2Jb"), "[study].name must be one directory name"),
])
def test_study_values_of_the_wrong_kind_name_the_key(study, message):
    with pytest.raises(ValueError) as info:
        parse_study(base(**study))
    assert str(info.value).startswith(message)


def test_documents_lengths_of_the_wrong_kind_name_the_key():
    data = base()
    data["documents"][0]["lengths"] = ["long"]
    with pytest.raises(ValueError, match=r"^\[\[documents\]\] #1\.lengths must be a list of "
                                         r"integers; got \['long'\]$"):
        parse_study(data)


def test_a_non_utf8_study_file_is_one_line(tmp_path):
    path = tmp_path / "s.toml"
    path.write_bytes(b'[study]\nname = "caf\xe9"\n')
    result = runner.invoke(app, ["study", str(path)])
    assert result.exit_code == 2
    assert one_line(result) == f"error: {path} is not UTF-8 text (byte 20); TOML files must be " \
                               "UTF-8"
