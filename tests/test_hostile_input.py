"""Issue 34: a careless user and an adversary. Nothing is written outside ``--out``, user text
never reaches the terminal with raw control characters, answers that would score silently
wrong are refused, every refusal is one line (a typed exception from Python), a partial report
says so, and ordinary folders, copies and paths resume."""

import errno
import json
import os
import shutil
import socket
import stat
import threading
import time

import pytest
from typer.testing import CliRunner

import kvdrift
from kvdrift.cli import app
from kvdrift.data import Document, DocumentError, load_jsonl, write_jsonl
from kvdrift.run.lock import StoreLock
from kvdrift.run.outdir import OutputDirRefused, check_output_dir
from kvdrift.run.store import NotARunStore
from kvdrift.study_config import check_study_name
from kvdrift.text import printable
from tests.test_cli_faults import error_line, run_args

runner = CliRunner()
PROMPT = "The cat sat on the mat. " * 10


def write_docs(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory):
    """A finished run (2 documents x 2 actions) and the documents file it read."""
    root = tmp_path_factory.mktemp("finished")
    docs = write_jsonl([Document(id=f"d{i}", prompt=PROMPT) for i in range(2)],
                       root / "docs.jsonl")
    out = root / "run"
    result = runner.invoke(app, run_args(tiny_model_dir, docs, out))
    assert result.exit_code == 0, result.output
    return out, docs


def copy_store(finished, dest):
    shutil.copytree(finished[0], dest)
    return dest


def unit_times(out):
    return {p.name: p.stat().st_mtime_ns for p in (out / "replicates").glob("*.parquet")}


# --- 1. nothing is written outside --out ------------------------------------------------------


@pytest.mark.parametrize("out, reason", [("/", "is the file-system root"),
                                         ("", "is empty"), ("   ", "is empty")])
def test_the_root_and_an_empty_path_are_refused(out, reason):
    with pytest.raises(OutputDirRefused) as info:
        check_output_dir(out)
    assert str(info.value) == (
        f"output directory {out!r} {reason}; allowed: a new or empty directory, or a kvdrift "
        "run or study directory to resume; choose another output directory (--out)")


def test_report_out_refuses_the_root_and_an_empty_path(finished):
    for out in ("/", ""):
        result = runner.invoke(app, ["report", str(finished[0]), "--out", out])
        assert result.exit_code == 2
        assert error_line(result).startswith(f"error: output directory {out!r} is ")


def test_out_empty_writes_nothing_into_the_current_directory(tiny_model_dir, tmp_path,
                                                             monkeypatch):
    docs = write_docs(tmp_path / "docs.jsonl", {"id": "a", "prompt": PROMPT})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    result = runner.invoke(app, run_args(tiny_model_dir, docs, ""))
    assert result.exit_code == 2
    assert error_line(result).startswith("error: output directory '' is empty; allowed: ")
    assert list(cwd.iterdir()) == []


def test_another_programs_folder_is_refused_and_left_alone(tiny_model_dir, tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl", {"id": "a", "prompt": PROMPT})
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "chapter1.tex").write_text("x")
    result = runner.invoke(app, run_args(tiny_model_dir, docs, folder))
    assert result.exit_code == 2
    assert error_line(result).startswith(
        f"error: output directory '{folder}' already holds files that are not a kvdrift run "
        "(e.g. 'chapter1.tex'); allowed: ")
    assert sorted(p.name for p in folder.iterdir()) == ["chapter1.tex"]
    with pytest.raises(OutputDirRefused):
        kvdrift.run_study(kvdrift.study_from_arguments(model=str(tiny_model_dir), docs=docs,
                                                       actions=["full"]), folder)


# --- 2. control characters in user text ---------------------------------------------------------


def test_printable_escapes_controls_and_keeps_every_script():
    assert printable("a\x1b]0;pwned\x07b\x1b[2J\x00\n\u202e\x85") == \
        "a\\x1b]0;pwned\\x07b\\x1b[2J\\x00\\n\\u202e\\x85"
    assert printable("résultats 数据 (v2) [bold]") == "résultats 数据 (v2) [bold]"


def test_escape_codes_in_document_ids_never_reach_the_terminal(tiny_model_dir, tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl",
                      {"id": "t\x1b]0;pwned\x07", "prompt": PROMPT},
                      {"id": "c\x1b[2J\x00x\ny", "prompt": PROMPT})
    out = tmp_path / "run"
    result = runner.invoke(app, run_args(tiny_model_dir, docs, out))
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x00" not in result.output
    assert "\x07" not in result.output
    assert "c\\x1b[2J\\x00x\\ny" in result.output  # the progress line, escaped
    duplicate = write_docs(tmp_path / "dup.jsonl", {"id": "c\x1b[2J", "prompt": PROMPT},
                           {"id": "c\x1b[2J", "prompt": PROMPT})
    refused = runner.invoke(app, run_args(tiny_model_dir, duplicate, tmp_path / "r2"))
    assert refused.exit_code == 2 and "\x1b" not in refused.output
    assert "duplicate id 'c\\x1b[2J'" in error_line(refused)


# --- 3. answers that would score silently wrong ------------------------------------------------


@pytest.mark.parametrize("extra, message", [
    ({"answer": ""}, "key 'answer' must be a non-empty string or null; got ''"),
    ({"answer": "  "}, "key 'answer' must be a non-empty string or null; got '  '"),
    ({"answers": [""]}, "key 'answers' must be a non-empty list of non-empty strings; got ['']"),
    ({"answers": [["4"], {"x": None}]}, "key 'answers' must be a non-empty list of non-empty "
                                        "strings; got [['4'], {'x': None}]"),
    ({"answers": "4"}, "key 'answers' must be a non-empty list of non-empty strings; got '4'"),
    ({"answers": []}, "key 'answers' must be a non-empty list of non-empty strings; got []"),
    ({"metric": "string_match_all"}, "metric 'string_match_all' needs expected answers to score "
                                     "against; give 'answer' or 'answers', or leave out 'metric' "
                                     "for a free-form prompt"),
    ({"metric": ["x"], "answer": "4"}, "key 'metric' must be one of string_match_all, "
                                       "string_match_part, final_answer; got ['x']"),
])
def test_answers_that_would_score_wrong_are_refused(tmp_path, extra, message):
    path = write_docs(tmp_path / "docs.jsonl", {"id": "a", "prompt": PROMPT} | extra)
    with pytest.raises(DocumentError) as info:
        load_jsonl(path)
    assert str(info.value) == f"{path}:1: {message}"
    answer = extra.get("answer")
    meta = {k: v for k, v in extra.items() if k != "answer"}
    with pytest.raises(DocumentError, match="^document 'a': "):
        Document(id="a", prompt=PROMPT, answer=answer, meta=meta)


def test_an_empty_answer_is_one_line_from_the_cli(tiny_model_dir, tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl", {"id": "a", "prompt": PROMPT, "answer": ""})
    result = runner.invoke(app, run_args(tiny_model_dir, docs, tmp_path / "run"))
    assert result.exit_code == 2
    assert error_line(result) == (f"error: {docs}:1: key 'answer' must be a non-empty string or "
                                  "null; got ''")
    metric = write_docs(tmp_path / "m.jsonl", {"id": "a", "prompt": PROMPT, "metric": {"a": 1}})
    result = runner.invoke(app, run_args(tiny_model_dir, metric, tmp_path / "run"))
    assert result.exit_code == 2 and error_line(result) == (
        f"error: {metric}:1: key 'metric' must be one of string_match_all, string_match_part, "
        "final_answer; got {'a': 1}")


# --- 4. damaged or foreign run.json: one line, a typed exception -------------------------------


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(versions=[1]), "'versions' must be an object; got [1]"),
    (lambda m: m["config"].update(horizon="four"),
     "config.horizon must be an integer >= 1; got 'four'"),
    (lambda m: m.update(config={"lr": 0.1}), "config.horizon must be an integer >= 1; got None"),
])
def test_a_damaged_or_foreign_run_json_is_one_line(finished, tmp_path, change, message):
    out = copy_store(finished, tmp_path / "store")
    meta = json.loads((out / "run.json").read_text())
    change(meta)
    (out / "run.json").write_text(json.dumps(meta))
    result = runner.invoke(app, ["report", str(out)])
    assert result.exit_code == 2
    assert error_line(result) == f"error: {out / 'run.json'} is damaged: {message}; delete it " \
        "(finished units keep their own settings and are checked on resume) or use another " \
        "output directory"
    with pytest.raises(NotARunStore, match=message.replace("[", r"\[").replace("]", r"\]")):
        kvdrift.analyze(out)


# --- 5. a partial report says so -----------------------------------------------------------------


def test_a_report_on_a_store_being_written_says_it_is_partial(finished, tmp_path):
    out = copy_store(finished, tmp_path / "store")
    done = sorted((out / "replicates").glob("full__d1*.parquet"))
    done[0].unlink()  # the unit the "run" has not finished yet
    with StoreLock(out):
        result = runner.invoke(app, ["report", str(out), "--bootstrap", "20"])
        analysis = kvdrift.analyze(out, bootstrap=20)
    assert result.exit_code == 0, result.output
    assert f"partial report: {out} is being written by another kvdrift process (PID " \
        f"{os.getpid()}); 3 units finished so far; missing: " in result.output
    assert " · d1 · full" in result.output and "--wait" in result.output
    assert analysis.meta.run["partial"]["writer"] == str(os.getpid())
    assert [m.split(" · ")[1:] for m in analysis.meta.run["partial"]["missing"]] == [["d1", "full"]]
    assert analysis.meta.notes[0].startswith("partial report: ")
    assert "partial report" in (out / "report" / "report.html").read_text()


def test_report_wait_waits_for_the_writer(finished, tmp_path):
    out = copy_store(finished, tmp_path / "store")
    lock = StoreLock(out).acquire()
    threading.Timer(1.0, lock.release).start()
    started = time.perf_counter()
    result = runner.invoke(app, ["report", str(out), "--wait", "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    assert time.perf_counter() - started >= 0.9
    assert "partial report" not in result.output


# --- 6. options that said the wrong thing -------------------------------------------------------


def test_allow_download_without_a_network_is_one_quick_line(tmp_path, monkeypatch):
    import huggingface_hub.constants

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def unreachable(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
    started = time.process_time()
    result = runner.invoke(app, ["run", "--model", "org/not-cached", "--allow-download",
                                 "--out", str(tmp_path / "r")])
    assert time.process_time() - started < 5  # CPU seconds, not wall: no retry loop ran
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith("error: cannot download model 'org/not-cached': the hub "
                           "https://huggingface.co cannot be reached (Name or service not known)")
    assert "--allow-download" not in line and not (tmp_path / "r").exists()
    from kvdrift.lm.loading.pretrained import HubUnreachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # how the Python API opts in to downloads
    config = kvdrift.study_from_arguments(model="org/not-cached", actions=["full"])
    with pytest.raises(HubUnreachable, match="cannot be reached"):
        kvdrift.run_study(config, tmp_path / "api")
    assert not (tmp_path / "api").exists()


def test_a_horizon_beyond_the_context_window_says_what_is_allowed(tiny_model_dir, tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl", {"id": "a", "prompt": PROMPT})
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--docs", str(docs),
                                 "--actions", "full", "--horizon", "60000",
                                 "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert error_line(result).startswith(
        "error: horizon H must be below ") and error_line(result).endswith(
        "context window of 4096 tokens, leaving room for the prompt (allowed: H <= 4095 minus "
        "the longest prompt's tokens); got 60000")
    from kvdrift.lm.factory import ContextWindowExceeded

    config = kvdrift.study_from_arguments(model=str(tiny_model_dir), docs=docs, actions=["full"],
                                          horizon=60000)
    with pytest.raises(ContextWindowExceeded, match="allowed: H <= 4095 minus"):
        kvdrift.run_study(config, tmp_path / "api")


def test_a_full_disk_names_the_file(tiny_model_dir, tmp_path, monkeypatch):
    import kvdrift.run.store as store_module

    def full(table, path, **kwargs):  # pyarrow's own error names no file
        raise OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(store_module.pq, "write_table", full)
    docs = write_docs(tmp_path / "docs.jsonl", {"id": "a", "prompt": PROMPT})
    result = runner.invoke(app, run_args(tiny_model_dir, docs, tmp_path / "run"))
    assert result.exit_code == 2
    line = error_line(result)
    assert line.startswith(f"error: {tmp_path / 'run' / 'documents'}/a-")  # the unit's first
    assert line.endswith(f".parquet: No space left on device (errno {errno.ENOSPC})")


# --- 7. ordinary use --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["résultats", "my run (v2)", ".hidden", "数据 実験"])
def test_ordinary_folder_names_are_valid_names(name):
    assert check_study_name(name) == name


def test_a_run_into_a_folder_with_an_accented_name(tiny_model_dir, finished, tmp_path):
    out = tmp_path / "my résultats (v2)"
    result = runner.invoke(app, run_args(tiny_model_dir, finished[1], out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["config"]["name"] == "my résultats (v2)"


def test_a_copied_store_resumes_without_recomputing(tiny_model_dir, finished, tmp_path):
    out = copy_store(finished, tmp_path / "copy of the run")
    before = unit_times(out)
    result = runner.invoke(app, run_args(tiny_model_dir, finished[1], out))
    assert result.exit_code == 0, result.output
    assert unit_times(out) == before


def test_the_same_documents_by_another_path_resume(tiny_model_dir, finished, tmp_path,
                                                   monkeypatch):
    out = copy_store(finished, tmp_path / "run")  # same folder name as the original
    before = unit_times(out)
    monkeypatch.chdir(finished[1].parent)
    result = runner.invoke(app, run_args(tiny_model_dir, "docs.jsonl", out))
    assert result.exit_code == 0, result.output
    assert unit_times(out) == before
    moved = tmp_path / "elsewhere.jsonl"  # a copy of the file: the same documents
    shutil.copy(finished[1], moved)
    assert runner.invoke(app, run_args(tiny_model_dir, moved, out)).exit_code == 0
    assert unit_times(out) == before
    other = write_docs(tmp_path / "other.jsonl", {"id": "d0", "prompt": "Other text. " * 20})
    result = runner.invoke(app, run_args(tiny_model_dir, other, out))
    assert result.exit_code == 2 and "differs in: documents" in error_line(result)


def test_a_jsonl_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "prompt": PROMPT}).encode() + b"\n")
    assert [d.id for d in load_jsonl(path)] == ["a"]


def test_store_files_follow_the_umask(finished):
    mask = os.umask(0)
    os.umask(mask)
    out = finished[0]
    for path in (out / "run.json", *out.glob("*/*.parquet")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path
