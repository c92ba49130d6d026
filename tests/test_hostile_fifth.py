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
                                            (".", "d1"), ("_mine", "_d2"), ("__", "_")])
def test_no_action_or_document_name_makes_a_file_the_reader_skips(tmp_path, action, doc_id):
    """An action named ``.vnorm`` wrote ``.vnorm__d0-....parquet``, a name the store's reader
    skips as a temporary: exit 0, its records never read, the report partial forever; one
    named ``_mine`` wrote ``_mine__...``, which pandas, pyarrow's datasets and Spark skip."""
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
        p.name.startswith((".", "_")) for p in tmp_path.rglob("*.parquet"))
    import pandas as pd  # the store reads whole outside kvdrift too
    import pyarrow.dataset as ds

    for kind in ("replicates", "steps"):
        assert (pd.read_parquet(tmp_path / kind)["action"] == action).sum() > 0
        assert ds.dataset(tmp_path / kind).to_table().num_rows == reread.read(kind).num_rows


FUNCTION_PRESSES = '''
import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
from kvpress import ScorerPress


def squash(x):
    return x.abs() * SCALE


SCALE = 1


class Knob:
    def __init__(self):
        self.level = 3


@dataclass
class FunctionPress(ScorerPress):
    fn: Callable = squash
    partial: Callable = functools.partial(max, 2)
    builtin: Callable = torch.softmax
    knob: object = field(default_factory=Knob)
    layer: torch.nn.Module = field(default_factory=lambda: torch.nn.Linear(2, 2, bias=False))
    pick: Callable = lambda s: s + 1

    def __post_init__(self):
        super().__post_init__()
        torch.nn.init.constant_(self.layer.weight, 0.5)

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return self.fn(keys.norm(dim=-1))


PRESS = FunctionPress(compression_ratio=0.5)
'''


def fresh_identity(tmp_path, source):
    """The press identity of ``PRESS`` in ``source``, computed in a fresh interpreter."""
    import json
    import os
    import subprocess
    import sys

    path = tmp_path / "function_presses.py"
    path.write_text(source)
    code = ("import json, sys, importlib.util\n"
            "spec = importlib.util.spec_from_file_location('function_presses', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "from kvdrift.lm.actions.identity import press_identity\n"
            "print(json.dumps(press_identity(m.PRESS)))\n")
    source_root = os.path.dirname(os.path.dirname(kvdrift.__file__))
    done = subprocess.run([sys.executable, "-B", "-c", code, str(path)], capture_output=True,
                          text=True, timeout=600, env=os.environ | {"PYTHONPATH": source_root})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_press_field_holding_a_function_has_an_identity_without_an_address(tmp_path):
    """``<function f at 0x...>`` in a press's identity made a finished store refuse its own
    command forever; now the same code is the same identity in every process."""
    from kvdrift.lm.actions.identity import identity_changes

    first = fresh_identity(tmp_path, FUNCTION_PRESSES)
    assert " at 0x" not in json_text(first)
    assert fresh_identity(tmp_path, FUNCTION_PRESSES) == first  # another process, same
    fields = first["fields"]
    assert fields["fn"]["function"] == "function_presses.squash"
    assert fields["knob"] == {"object": "function_presses.Knob", "fields": {"level": 3}}
    assert fields["layer"]["module"] == "torch.nn.modules.linear.Linear"
    changed = fresh_identity(tmp_path, FUNCTION_PRESSES.replace("x.abs() * SCALE",
                                                                "x.abs() * 2"))
    assert "; field fn {'function': 'function_presses.squash', 'code': '" in identity_changes(
        first, changed)  # the code, named (the file's own digest changes too)
    assert changed["fields"]["knob"] == fields["knob"]
    weights = fresh_identity(tmp_path, FUNCTION_PRESSES.replace("weight, 0.5)", "weight, 0.25)"))
    assert "; field layer {'module': 'torch.nn.modules.linear.Linear', 'state_sha25" in (
        identity_changes(first, weights))  # its weights, named


def json_text(value) -> str:
    import json

    return json.dumps(value)


WEIGHT_WRITING_PRESSES = '''
from dataclasses import dataclass

import torch
from kvpress import ScorerPress


@dataclass
class DoublingPress(ScorerPress):
    """Scores by key norm, and doubles the layer's output projection while at it."""

    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        with torch.no_grad():
            module.o_proj.weight *= 2
        return keys.norm(dim=-1)


@dataclass
class QuietPress(ScorerPress):
    """The same scores, weights left alone."""

    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys.norm(dim=-1)


PRESSES = {"doubling": DoublingPress(compression_ratio=0.5),
           "quiet": QuietPress(compression_ratio=0.5)}
'''


def test_a_press_that_writes_the_weights_stops_the_run_in_one_line(tiny_model_dir, tmp_path):
    """``o_proj.weight *= 2`` inside ``score`` changed the other actions' records, stored
    under the original weights digest; now the unit is not stored and the run stops."""
    presses = tmp_path / "weight_presses.py"
    presses.write_text(WEIGHT_WRITING_PRESSES)
    docs = write_jsonl([Document(id="d0", prompt="The cat sat on the mat. " * 10)],
                       tmp_path / "docs.jsonl")
    out = tmp_path / "run"
    args = run_args(tiny_model_dir, docs, out)
    args[args.index("--actions") + 1] = "full,quiet,doubling,snapkv-half"
    result = runner.invoke(app, [*args, "--presses", str(presses)])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: action 'doubling' (DoublingPress) changed the model's "
                           "weights on document 'd0' (weights digest "), line
    assert line.endswith("the unit is not stored and the run stops here (finished units are "
                         "kept)"), line
    stored = pq.read_table(out / "replicates").column("action").unique().to_pylist()
    assert sorted(stored) == ["full", "quiet"]  # finished before it; nothing of it or after


def test_from_python_a_weight_writing_press_raises_and_the_quiet_one_runs(tiny_model_dir,
                                                                          tmp_path):
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvdrift.lm.engine.press_path import PressFailed
    from kvdrift.lm.loading.digest import weights_digest

    path = tmp_path / "weight_presses_api.py"
    path.write_text(WEIGHT_WRITING_PRESSES)
    spec = importlib.util.spec_from_file_location("weight_presses_api", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    docs = write_jsonl([Document(id="d0", prompt="The cat sat on the mat. " * 10)],
                       tmp_path / "docs.jsonl")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    mine = kvdrift.Model(model, AutoTokenizer.from_pretrained(tiny_model_dir), "mine")
    before = weights_digest(model)
    quiet = kvdrift.measure(mine, {"quiet": module.PRESSES["quiet"]}, docs=docs,
                            replicates=2, horizon=4, bootstrap=0)
    assert len(quiet.records.replicates) == 2 and weights_digest(model) == before
    with pytest.raises(PressFailed, match=r"^action 'doubling' \(DoublingPress\) changed the "
                                          r"model's weights on document 'd0'"):
        kvdrift.measure(mine, {"doubling": module.PRESSES["doubling"]}, docs=docs,
                        replicates=2, horizon=4, bootstrap=0)


@pytest.mark.parametrize("folder", ["documents", "replicates"])
def test_a_fifo_among_the_records_is_refused_before_torch(finished, tmp_path, folder):
    """A FIFO in ``documents/`` was refused only after 13 s (after the tokenizer and the
    analysis had loaded); now before torch, and never waited on."""
    import os

    from tests.test_hostile_refusals import fresh_cli

    out = tmp_path / "store"
    shutil.copytree(finished, out)
    os.mkfifo(out / folder / "zz-000000000000.parquet")
    for args in (("show", "store"), ("report", "store", "--bootstrap", "0")):
        code, loaded, stderr, _ = fresh_cli(*args, cwd=tmp_path)
        assert code == 2 and loaded == [], (args, stderr, loaded)
        assert stderr.startswith(f"error: store/{folder}/zz-000000000000.parquet is a FIFO"), \
            stderr
        assert len(stderr.strip().splitlines()) == 1
