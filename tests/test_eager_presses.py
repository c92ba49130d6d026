"""Presses that read attention weights run from the command line: their prefill is switched
to eager attention (found by reading the press's code, or asked for with ``--attention
eager``), and the store says so (run.json, each unit's fingerprint)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import kvpress
import pytest
import torch
from kvpress import ScorerPress
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data.document import Document
from kvdrift.data.loaders import write_jsonl
from kvdrift.lm.actions.attention_use import needs_eager

ATTENTION_PRESS = '''
from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class AttentionSumPress(ScorerPress):
    """kvpress's new_press.ipynb: score each entry by the attention it received."""

    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return attentions.sum(2).mean(1, keepdim=True).expand(-1, keys.shape[1], -1)


PRESSES = {"mine": AttentionSumPress(compression_ratio=0.5)}
'''


@dataclass
class _UsesAttentions(ScorerPress):
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        weights = attentions[..., -1, :]
        return weights.mean(1, keepdim=True).expand(-1, keys.shape[1], -1)


@dataclass
class _OnlyReceivesThem(ScorerPress):
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys.norm(dim=-1)


@dataclass
class _Inherits(_UsesAttentions):
    pass


@pytest.mark.parametrize("press, eager", [
    (_UsesAttentions(0.5), True),
    (_Inherits(0.5), True),
    (_OnlyReceivesThem(0.5), False),
    (kvpress.KnormPress(0.5), False),  # kvpress's own: read by name, TOVA and Finch cope
    (kvpress.TOVAPress(0.5), False),
    (kvpress.ObservedAttentionPress(0.5), True),
    (kvpress.ComposedPress([kvpress.KnormPress(0.2), kvpress.ObservedAttentionPress(0.2)]), True),
    (kvpress.AdaKVPress(_UsesAttentions(0.5)), True),
])
def test_presses_that_read_attention_weights_are_found(press, eager):
    assert needs_eager(press) is eager


def test_a_press_reading_attentions_runs_from_the_command_line(tiny_model_dir, tmp_path):
    import pyarrow.parquet as pq

    from kvdrift.lm.loading.model import load_model
    from kvdrift.run import fingerprint as fp

    presses = tmp_path / "presses.py"
    presses.write_text(ATTENTION_PRESS)
    docs = write_jsonl([Document("d0", "The cat sat on the mat. " * 10)], tmp_path / "d.jsonl")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir), "--docs",
                                      str(docs), "--actions", "mine,full", "--presses",
                                      str(presses), "--replicates", "2", "--horizon", "4",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["eager_prefill"] == ["mine"] and "attention" not in config

    units = {}
    for path in (out / "replicates").rglob("*.parquet"):
        table = pq.read_table(path)
        units[table.column("action")[0].as_py()] = fp.decode(table.schema.metadata)
    assert units["mine"]["attention"] == "eager" and "attention" not in units["full"]
    # without the switch the press fails inside kvpress, as the review found
    loaded = load_model(str(tiny_model_dir))
    namespace: dict = {}
    exec(compile(ATTENTION_PRESS, "presses.py", "exec"), namespace)
    with pytest.raises(AttributeError, match="NoneType"), torch.no_grad(), \
            namespace["PRESSES"]["mine"](loaded.model):
        loaded.model(torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]]))


def test_attention_eager_is_a_flag_recorded_in_run_json(tiny_model_dir, tmp_path):
    presses = tmp_path / "presses.py"
    presses.write_text(ATTENTION_PRESS.replace("attentions.sum(2)", "keys.norm(dim=-1)[:, :1]")
                       .replace(".mean(1, keepdim=True)", ""))
    docs = write_jsonl([Document("d0", "The cat sat on the mat. " * 10)], tmp_path / "d.jsonl")
    out = tmp_path / "run"
    args = ["run", "--model", str(tiny_model_dir), "--docs", str(docs), "--actions", "mine",
            "--presses", str(presses), "--replicates", "2", "--horizon", "4", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--attention", "eager"])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["attention"] == "eager" and config["eager_prefill"] == ["mine"]
    bad = CliRunner().invoke(app, [*args, "--attention", "flash"])
    assert bad.exit_code != 0 and "--attention must be one of auto, eager; got 'flash'" in \
        bad.output


def test_switching_to_eager_attention_is_said_in_one_line(tiny_model_dir, tmp_path, capfd):
    """The command line says which press's prefill runs eager, once, and why; a run without
    such a press says nothing of it; the Python API says the same line."""
    import kvdrift

    presses = tmp_path / "presses.py"
    presses.write_text(ATTENTION_PRESS)
    docs = write_jsonl([Document("d0", "The cat sat on the mat. " * 10)], tmp_path / "d.jsonl")
    args = ["run", "--model", str(tiny_model_dir), "--docs", str(docs), "--presses",
            str(presses), "--replicates", "1", "--horizon", "2"]
    said = CliRunner().invoke(app, [*args, "--actions", "mine,full", "--out",
                                    str(tmp_path / "a")])
    assert said.exit_code == 0, said.output
    lines = [line for line in said.output.splitlines() if "eager attention" in line]
    assert len(lines) == 1 and "for mine (its code reads attention weights" in lines[0]
    quiet = CliRunner().invoke(app, [*args, "--actions", "full", "--out", str(tmp_path / "b")])
    assert quiet.exit_code == 0 and "eager attention" not in quiet.output
    namespace: dict = {}
    exec(compile(ATTENTION_PRESS, "presses.py", "exec"), namespace)
    capfd.readouterr()
    kvdrift.measure(str(tiny_model_dir), {"mine": namespace["PRESSES"]["mine"]}, docs,
                    replicates=1, horizon=2, bootstrap=0)
    err = capfd.readouterr().err
    assert err.count("prefill with eager attention for mine") == 1
