"""A store stands alone: it records its documents (prompt text, answer, stratum, the prompt's
token ids as the model saw them) and the model's identity (the weights' and tokenizer's
digests) per unit; whatever shows text reads the store, never the study's sources again.

The runs are the tiny random Llama saved with the embedded SmolLM2 tokenizer
(``tiny_model_dir``)."""

from __future__ import annotations

import re
import shutil

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data import Document, write_jsonl
from kvdrift.run import fingerprint as fp

runner = CliRunner()
PROMPT = "Note {i}. The code is 4417. " + "The cat sat on the mat. " * 14


def _run(model, docs, out, *more):
    return runner.invoke(app, ["run", "--model", str(model), "--docs", str(docs), "--actions",
                               "full,recent-half", "--replicates", "2", "--horizon", "4",
                               "--out", str(out), *more])


def _shown(store):
    """What show, trajectories and the report's Examples give for ``store``."""
    import warnings

    import kvdrift
    from kvdrift.directory import StudyDirectory
    from kvdrift.report.page import render_blocks
    from kvdrift.report.sections.examples import examples_blocks

    show = runner.invoke(app, ["show", str(store), "--prompt-tokens", "40"])
    assert show.exit_code == 0, show.output
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the recorded tokenizer is the one loaded: no note
        frame = kvdrift.trajectories(store)
    return show.stdout, show.stderr, frame, render_blocks(examples_blocks(StudyDirectory(store)))


@pytest.fixture(scope="module")
def store(tiny_model_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("documents")
    docs = [Document(id=f"d{i}", prompt=PROMPT.format(i=i), stratum=f"s{i}",
                     answer="4417", meta={"metric": "string_match_all", "task": "code"})
            for i in range(2)]
    write_jsonl(docs, base / "docs.jsonl")
    ran = _run(tiny_model_dir, base / "docs.jsonl", base / "run")
    assert ran.exit_code == 0, ran.output
    return base / "run", docs


def test_the_store_records_each_document_as_the_model_saw_it(store, tiny_model_dir):
    from kvdrift.directory import StudyDirectory
    from kvdrift.lm.loading.model import encode_prompt, load_model

    out, docs = store
    loaded = load_model(str(tiny_model_dir))
    recorded = StudyDirectory(out).documents
    assert set(recorded) == {(str(tiny_model_dir), d.id) for d in docs}
    for doc in docs:
        found = recorded[(str(tiny_model_dir), doc.id)]
        assert found.document == doc  # id, prompt, stratum, answer, metric (meta)
        assert list(found.prompt_ids) == encode_prompt(loaded.tokenizer, doc.prompt)[0].tolist()
        unit = StudyDirectory(out).unit_fingerprint(str(tiny_model_dir), doc.id, "recent-half")
        assert found.fingerprint == unit  # fingerprinted like the records
        assert unit["weights_sha256"] == loaded.identity["weights_sha256"]
        assert unit["tokenizer_sha256"] == loaded.identity["tokenizer_sha256"]
    files = sorted((out / "documents").glob("*.parquet"))
    assert len(files) == 2 and pq.read_table(files[0]).column_names == [
        "model", "doc_id", "stratum", "prompt", "answer", "metric", "meta", "prompt_ids",
        "question"]
    stamps = [f.stat().st_mtime_ns for f in files]
    again = _run(tiny_model_dir, out.parent / "docs.jsonl", out)  # all done: nothing rewritten
    assert again.exit_code == 0 and [f.stat().st_mtime_ns for f in files] == stamps


def test_a_store_copied_elsewhere_without_its_jsonl_shows_the_same_text(store, tmp_path):
    out, _ = store
    before = _shown(out)
    assert "prompt ends: …" in before[0] and "The cat sat on the mat." in before[3]
    copy = tmp_path / "elsewhere" / "run"
    shutil.copytree(out, copy)
    source = out.parent / "docs.jsonl"
    hidden = source.rename(tmp_path / "moved.jsonl")  # the JSONL is gone
    try:
        after = _shown(copy)
    finally:
        hidden.rename(source)
    assert after[:2] == before[:2]  # show: stdout and notes
    assert after[2].equals(before[2]) and after[2].attrs == before[2].attrs
    assert after[3] == before[3]  # the report's Examples


def _strip_identity(store):
    """The store as kvdrift wrote it before documents and digests were recorded."""
    shutil.rmtree(store / "documents")
    for path in [*store.glob("steps/*.parquet"), *store.glob("replicates/*.parquet")]:
        table = pq.read_table(path)
        meta = dict(table.schema.metadata)
        stored = fp.decode(meta)
        for key in fp.IDENTITY:
            stored.pop(key)
        meta[fp.METADATA_KEY] = fp.encode(stored)
        pq.write_table(table.replace_schema_metadata(meta), path)


def _without_prompt(lines: list[str]) -> list[str]:
    """show's lines without the prompt's end: its line and its wrapped continuations (two
    spaces, then text)."""
    out, inside = [], False
    for line in lines:
        inside = line.startswith("prompt ends") or (inside and re.match(r"^  \S", line))
        if not inside:
            out.append(line)
    return out


def test_an_old_store_without_documents_or_digests_still_reads_and_resumes(store, tmp_path,
                                                                            tiny_model_dir):
    out, _ = store
    old = tmp_path / "old"
    shutil.copytree(out, old)
    _strip_identity(old)
    stdout, stderr, frame, html = _shown(old)
    before = _shown(out)
    assert frame.equals(before[2])  # the records decode as before
    assert "prompt ends" not in stdout and "prompt ends" not in html
    note = "the prompts are not shown: this store was written before kvdrift recorded its"
    assert note in stderr and note in html
    assert stdout.splitlines() == _without_prompt(before[0].splitlines())
    resumed = _run(tiny_model_dir, out.parent / "docs.jsonl", old)
    assert resumed.exit_code == 0, resumed.output
    assert "recomputing" not in resumed.output  # its units are kept as they are


def test_a_resume_with_other_weights_under_the_same_name_is_refused_naming_both(
        tiny_model_dir, tmp_path):
    import torch
    from transformers import LlamaForCausalLM

    from kvdrift.directory import StudyDirectory
    from kvdrift.lm.loading.digest import short, weights_digest

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    write_jsonl([Document(id="d0", prompt=PROMPT.format(i=0))], tmp_path / "docs.jsonl")
    out = tmp_path / "run"
    first = runner.invoke(app, ["run", "--model", str(model), "--docs",
                                str(tmp_path / "docs.jsonl"), "--actions", "recent-half",
                                "--replicates", "2", "--horizon", "3", "--out", str(out)])
    assert first.exit_code == 0, first.output
    was = StudyDirectory(out).unit_fingerprint(str(model), "d0", "recent-half")
    weights = LlamaForCausalLM.from_pretrained(model)
    with torch.no_grad():
        weights.model.norm.weight.mul_(1.5)  # other values under the same name
    weights.save_pretrained(model)
    now = weights_digest(weights)
    assert now != was["weights_sha256"]
    args = ["run", "--model", str(model), "--docs", str(tmp_path / "docs.jsonl"), "--actions",
            "recent-half", "--replicates", "2", "--horizon", "3", "--out", str(out)]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    [line] = [ln for ln in refused.output.splitlines() if ln.startswith("error:")]
    assert (f"other weights under the same model name (weights {short(was['weights_sha256'])}, "
            f"this run has {short(now)})") in line and "--recompute" in line
    redone = runner.invoke(app, [*args, "--recompute"])
    assert redone.exit_code == 0, redone.output
    unit = StudyDirectory(out).unit_fingerprint(str(model), "d0", "recent-half")
    assert unit["weights_sha256"] == now
    assert StudyDirectory(out).documents[(str(model), "d0")].fingerprint == unit


def test_the_models_identity_is_compared_only_where_both_record_it():
    from kvdrift.run.fingerprint import first_difference
    from kvdrift.run.runner import RunConfig

    doc = Document(id="d", prompt="p")
    mine = {"weights_sha256": "a" * 64, "tokenizer_sha256": "b" * 64}
    plain, with_it = RunConfig().fingerprint(doc), RunConfig().fingerprint(doc, identity=mine)
    assert first_difference(plain, with_it) is None  # a store before digests resumes
    assert first_difference(with_it, plain) is None  # a driver that loaded no weights
    other = with_it | {"tokenizer_sha256": "c" * 64}
    assert first_difference(with_it, other) == (
        "it was computed with another tokenizer under the same model name (tokenizer "
        "bbbbbbbbbbbb, this run has cccccccccccc)")


def test_a_tokenizer_other_than_the_recorded_one_is_named(tiny_model_dir):
    from kvdrift.examples.decoding import _loaded_digest, tokenizer_mismatch
    from kvdrift.lm.loading.digest import short

    model = str(tiny_model_dir)
    loaded = _loaded_digest(model)
    assert tokenizer_mismatch(model, {loaded}) is None and tokenizer_mismatch(model, set()) is None
    note = tokenizer_mismatch(model, {"f" * 64})
    assert f"(digest {short(loaded)}) is not the one the run recorded (ffffffffffff)" in note
    assert "\n" not in note


def test_show_and_trajectories_name_a_tokenizer_other_than_the_recorded_one(store, tmp_path):
    import kvdrift

    out, _ = store
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    for path in copy.glob("documents/*.parquet"):  # as if the run had another tokenizer
        table = pq.read_table(path)
        meta = dict(table.schema.metadata)
        meta[fp.METADATA_KEY] = fp.encode(fp.decode(meta) | {"tokenizer_sha256": "e" * 64})
        pq.write_table(table.replace_schema_metadata(meta), path)
    words = "is not the one the run recorded (eeeeeeeeeeee); text is decoded with the one"
    with pytest.warns(UserWarning, match=r"is not the one the run recorded \(eeeeeeeeeeee\)"):
        kvdrift.trajectories(copy)
    shown = runner.invoke(app, ["show", str(copy)])
    assert shown.exit_code == 0 and words in shown.stderr
