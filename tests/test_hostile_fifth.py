"""Issue 52, items 3 and 4 (the fifth hostile round): nothing mixed or lost silently, no crash
from any id in a store, no folder overwritten that kvdrift did not mark as its own."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import kvdrift
from kvdrift.cli import app
from kvdrift.data import Document, write_jsonl
from tests.test_cli_faults import run_args

runner = CliRunner()
HUGE = 2**32 + 7


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory):
    """A finished run (2 documents x 2 actions)."""
    root = tmp_path_factory.mktemp("finished")
    docs = write_jsonl([Document(id=f"d{i}", prompt="The cat sat on the mat. " * 10)
                        for i in range(2)], root / "docs.jsonl")
    out = root / "run"
    result = runner.invoke(app, run_args(tiny_model_dir, docs, out))
    assert result.exit_code == 0, result.output
    return out


def with_huge_ids(store, dest):
    """A copy of ``store`` whose every recorded token id (the branches' tokens and the
    prompts' ids) is at or above 2**32."""
    shutil.copytree(store, dest)
    for path in [*(dest / "steps").glob("*.parquet"), *(dest / "documents").glob("*.parquet")]:
        table = pq.read_table(path)
        for name in ("x_token", "y_token"):
            if name in table.column_names:
                i = table.column_names.index(name)
                table = table.set_column(i, table.schema.field(i), pa.array(
                    [HUGE + j for j in range(table.num_rows)], pa.int64()))
        if "prompt_ids" in table.column_names:
            i = table.column_names.index("prompt_ids")
            table = table.set_column(i, table.schema.field(i), pa.array(
                [[1, HUGE, 2] for _ in range(table.num_rows)], table.schema.field(i).type))
        pq.write_table(table, path, compression=None)  # metadata (fingerprints) kept
    return dest


def test_token_ids_past_the_vocabulary_are_shown_as_ids_not_a_traceback(finished, tmp_path):
    out = with_huge_ids(finished, tmp_path / "huge")
    shown = runner.invoke(app, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    assert f"[{HUGE}]" in shown.output  # the id itself, where a token would be
    report = runner.invoke(app, ["report", str(out), "--bootstrap", "0"])
    assert report.exit_code == 0, report.output
    assert f"[{HUGE}]" in (out / "report" / "report.html").read_text(encoding="utf-8")
    frame = kvdrift.trajectories(out)
    assert frame["x_text"].str.contains(rf"\[{HUGE}\]").any()


def test_token_text_writes_an_unknown_id_between_decoded_runs(tiny_model_dir):
    from kvdrift.examples.decoding import TokenText
    from kvdrift.lm.loading.model import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    text = TokenText("tiny", tokenizer)
    hello = tokenizer.encode("Hello world", add_special_tokens=False)
    assert text.text([*hello, HUGE, len(tokenizer), -1, *hello]) == (
        f"Hello world[{HUGE}][{len(tokenizer)}]Hello world")
    assert text.piece(HUGE) == f"[{HUGE}]" and text.piece(-3) == ""
    assert text.piece(hello[0]) == tokenizer.decode([hello[0]])


def test_a_report_never_overwrites_a_folder_kvdrift_did_not_mark(finished, tmp_path):
    mine = tmp_path / "mine"
    (mine / "figures").mkdir(parents=True)
    (mine / "analysis.json").write_text('{"mine": true}')
    (mine / "figures" / "plot.png").write_bytes(b"my figure")
    result = runner.invoke(app, ["report", str(finished), "--out", str(mine), "--bootstrap", "0"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"error: output directory {str(mine)!r} holds files that kvdrift did not mark as its "
        "report (no .kvdrift marker, no report.html; e.g. 'analysis.json'), which a report "
        "would overwrite; allowed: a new or empty directory, or a kvdrift run or study "
        "directory to resume; choose another output directory (--out)")
    assert (mine / "analysis.json").read_text() == '{"mine": true}'
    assert (mine / "figures" / "plot.png").read_bytes() == b"my figure"
    assert sorted(p.name for p in mine.rglob("*")) == ["analysis.json", "figures", "plot.png"]
    again = runner.invoke(app, ["report", str(finished), "--out", str(tmp_path / "new"),
                                "--bootstrap", "0"])
    assert again.exit_code == 0, again.output  # a new folder is marked, and rewritten after
    assert runner.invoke(app, ["report", str(finished), "--out", str(tmp_path / "new"),
                               "--bootstrap", "0"]).exit_code == 0


@pytest.mark.parametrize("entry", ["folder", "text", "empty"])
def test_a_dot_kvdrift_entry_that_is_no_marker_is_not_taken_for_one(tmp_path, entry):
    from kvdrift.output import MARKER
    from kvdrift.run.outdir import OutputDirRefused, check_output_dir, folder_kind

    home = tmp_path / "home"
    home.mkdir()
    stray = home / MARKER
    if entry == "folder":  # KVDRIFT_CACHE=~/.kvdrift
        (stray / "smollm2").mkdir(parents=True)
    else:
        stray.write_text("my notes\n" if entry == "text" else "")
    assert folder_kind(home) is None
    assert check_output_dir(home / "runs" / "out") == home / "runs" / "out"  # not refused
    with pytest.raises(OutputDirRefused, match=r"holds a '\.kvdrift' entry that is not a "
                                               r"kvdrift marker"):
        check_output_dir(home)  # never written as if it were one of kvdrift's folders
    marked = tmp_path / "run"
    marked.mkdir()
    (marked / MARKER).write_text("kvdrift run\n")
    assert folder_kind(marked) == "run"
    with pytest.raises(OutputDirRefused, match="lies inside the kvdrift directory"):
        check_output_dir(marked / "inner")


@pytest.mark.parametrize("action, doc_id", [(".vnorm", "d0"), ("..", ".hidden"),
                                            (".", "d1")])
def test_no_action_or_document_name_makes_a_file_the_reader_skips(tmp_path, action, doc_id):
    """An action named ``.vnorm`` wrote ``.vnorm__d0-....parquet``, a name the store's reader
    skips as a temporary: exit 0, its records never read, the report partial forever."""
    from kvdrift.finite import random_pair
    from kvdrift.run.documents import document_name
    from kvdrift.run.records import UnitKey
    from kvdrift.run.runner import RunConfig, run_units
    from kvdrift.run.store import RunStore, unit_name

    key = UnitKey(model="m", doc_id=doc_id, action=action, stratum="s")
    assert not unit_name(key).startswith(".") and not document_name("m", doc_id).startswith(".")
    cfg = RunConfig(model="m", actions=(action, "full"), replicates=3, horizon=4, seed=1)
    store = RunStore.open(tmp_path, cfg.as_dict())
    pair = random_pair(3, 4, seed=7, mix=0.6, eos_token_id=2)
    assert run_units(cfg, [Document(id=doc_id, prompt="p")], lambda d, a: pair, store) == 2
    reread = RunStore(tmp_path)
    reps = reread.read("replicates").to_pandas()
    assert sorted(reps["action"].unique()) == sorted([action, "full"])
    assert (reps["action"] == action).sum() == 3  # every replicate, read back
    assert reread.is_done(key) and not any(
        p.name.startswith(".") for p in tmp_path.rglob("*.parquet"))
