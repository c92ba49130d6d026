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
