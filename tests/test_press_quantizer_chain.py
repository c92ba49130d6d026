"""A press object chains with kvdrift's quantizers (``mine+kivi:bits=4``): its records equal
the same chain built from the named action, for a quantizer after the prefill (KIVI) and one
that quantizes as entries enter the prefill's cache (llama.cpp's q8_0)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data.document import Document
from kvdrift.data.loaders import write_jsonl

PRESSES = '''
from kvpress import KnormPress

PRESSES = {"mine": KnormPress(compression_ratio=0.5)}
'''
COLUMNS = ["doc_id", "replicate", "t", "x_token", "y_token", "delta", "f", "logq_x", "mismatch"]


@pytest.mark.parametrize("quantizer", ["kivi:bits=4", "gguf:k=q8_0,v=q8_0"])
def test_a_press_object_chains_like_the_named_action(tiny_model_dir_hd64, tmp_path, quantizer):
    from kvdrift.directory import StudyDirectory

    presses = tmp_path / "presses.py"
    presses.write_text(PRESSES)
    docs = write_jsonl([Document(f"d{i}", "The cat sat on the mat and looked around. " * (6 + i))
                        for i in range(2)], tmp_path / "d.jsonl")
    out = tmp_path / "run"
    mine, named = f"mine+{quantizer}", f"knorm:ratio=0.5+{quantizer}"
    result = CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir_hd64), "--docs",
                                      str(docs), "--actions", f"{mine},{named}", "--presses",
                                      str(presses), "--replicates", "3", "--horizon", "5",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = StudyDirectory(out).records()
    steps = records.steps
    a = steps[steps.action == mine].sort_values(COLUMNS[:3])[COLUMNS].reset_index(drop=True)
    b = steps[steps.action == named].sort_values(COLUMNS[:3])[COLUMNS].reset_index(drop=True)
    assert len(a) == 2 * 3 * 5 and a.equals(b)
    reps = records.replicates
    fractions = reps.groupby("action").kv_fraction.first()
    assert fractions[mine] == pytest.approx(fractions[named], rel=1e-12)
    assert fractions[mine] < 0.5  # half the entries, at fewer bits than float32


def test_a_chain_on_a_press_that_hides_per_head_is_refused(tiny_model_dir_hd64, tmp_path):
    presses = tmp_path / "presses.py"
    presses.write_text("from kvpress import AdaKVPress, KnormPress\n"
                       "PRESSES = {'ada': AdaKVPress(KnormPress(compression_ratio=0.5))}\n")
    docs = write_jsonl([Document("d0", "The cat sat on the mat. " * 8)], tmp_path / "d.jsonl")
    result = CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir_hd64), "--docs",
                                      str(docs), "--actions", "ada+kivi:bits=4", "--presses",
                                      str(presses), "--replicates", "2", "--horizon", "3",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code != 0
    assert "action 'ada+kivi:bits=4': its press hides entries per KV head; a quantization " \
        "can follow a press that keeps one set of entries per KV head" in result.output
