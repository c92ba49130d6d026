"""``kvdrift.measure(docs=[...])``: documents handed over in memory are the documents a JSONL
file of the same lines gives, refused in one line naming the item, and recorded whole by a
store (a resume with other documents is refused); ``kvdrift.embedded_model_path()``."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import kvdrift
from kvdrift.data.document import DocumentError
from kvdrift.study_config import recorded_study

CONTEXT = "The archive keeps three keys. The red key opens the north door, the blue key the cellar."
DOCS = [{"id": "keys", "context": CONTEXT,
         "questions": ["Which key opens the cellar?", {"question": "And the north door?",
                                                        "answer": "red"}]},
        {"id": 7, "prompt": "Write one line about rivers.", "stratum": "free"}]
RUN = {"replicates": 2, "horizon": 4, "bootstrap": 0, "seed": 3}


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in ("doc_id", "action", "replicate", "t") if k in frame]
    timings = [c for c in frame if c.endswith("seconds")]  # how long it took differs
    return frame.drop(columns=timings).sort_values(keys).reset_index(drop=True)


def test_documents_in_memory_measure_as_the_same_lines_in_a_file(tiny_model_dir, tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
    model = str(tiny_model_dir)
    held = kvdrift.measure(model, ("snapkv-half",), DOCS, **RUN)
    read = kvdrift.measure(model, ("snapkv-half",), path, **RUN)
    assert sorted(held.records.replicates["doc_id"].unique()) == ["7", "keys:q1", "keys:q2"]
    pd.testing.assert_frame_equal(_sorted(held.records.steps), _sorted(read.records.steps))
    pd.testing.assert_frame_equal(_sorted(held.records.replicates),
                                  _sorted(read.records.replicates))
    assert list(tmp_path.iterdir()) == [path]  # nothing written for the documents


def test_a_store_records_the_documents_and_refuses_others_on_resume(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    model = str(tiny_model_dir)
    kvdrift.measure(model, ("snapkv-half",), DOCS, out, **RUN)
    recorded = json.loads((out / "run.json").read_text(encoding="utf-8"))["config"]
    study = recorded_study(recorded)  # parsed back as `kvdrift report` does
    assert [d.id for src in study.documents for d in src.documents()] == [
        "keys:q1", "keys:q2", "7"]
    again = kvdrift.measure(model, ("snapkv-half",), DOCS, out, **RUN)  # resumes: nothing new
    assert len(again.records.replicates) == 3 * RUN["replicates"]
    other = [dict(DOCS[1], prompt="Write one line about mountains.")]
    with pytest.raises(ValueError) as refused:
        kvdrift.measure(model, ("snapkv-half",), other, out, **RUN)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("docs", "says"), [
    (42, "docs must be a list of document objects"),
    ({"id": "a", "prompt": "x"}, "docs must be a list of document objects"),
    ([], "docs is empty"),
    ([{"prompt": "x"}], "docs[0]: missing key 'id'"),
    ([{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}],
     "docs[1]: duplicate id 'a' (first in docs[0])"),
    ([{"id": "a", "prompt": "   "}], "docs[0]: key 'prompt' must be a non-empty string"),
    ([{"id": "a", "prompt": "x", "meta": {"when": object()}}], "docs[0]: must hold JSON values"),
    ([{"id": "a", "context": "c", "questions": []}], "docs[0]: key 'questions' must be"),
    ([{"id": "a", "context": "c", "questions": ["q", 3]}], "docs[0]: question 2 must be"),
])
def test_bad_documents_in_memory_are_refused_in_one_line_naming_the_item(docs, says):
    with pytest.raises(DocumentError) as refused:
        kvdrift.measure("smollm2", ("snapkv-half",), docs, replicates=1, horizon=1)
    message = str(refused.value)
    assert says in message and "\n" not in message
    assert "File name too long" not in message


def test_the_embedded_models_path_is_public_and_is_the_converted_folder():
    from kvdrift.lm.loading.model import smollm2_path

    path = kvdrift.embedded_model_path()
    assert "embedded_model_path" in kvdrift.__all__
    assert path == smollm2_path() and (path / "config.json").is_file()


def test_the_documents_page_example_is_accepted_as_written():
    """docs/documents.md's in-memory documents pass the checks (no model is loaded)."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "documents.md").read_text("utf-8")
    section = page[page.index("## Documents in memory"):page.index("## A Hugging Face")]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec(block.split("result = ")[0], namespace)  # the documents, not the run
    config = kvdrift.study_from_arguments("smollm2", ["snapkv-half"], namespace["docs"])
    (source,) = config.documents
    assert [d.id for d in source.documents()] == ["keys:q1", "keys:q2", "7"]
