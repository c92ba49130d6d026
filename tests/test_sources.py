"""Typed document sources: the documents each yields, and the table each writes back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvdrift
from kvdrift.data import (
    Document,
    HFSource,
    JsonlSource,
    RulerConfig,
    RulerSource,
    generate,
    load_hf_dataset,
    load_jsonl,
    source_from_table,
    token_counter,
    write_jsonl,
)
from kvdrift.study import fixed_documents, model_documents
from kvdrift.study_config import SOURCE_KEYS, load_study, parse_study
from tests.messages import whole

CONFIGS = Path(kvdrift.__file__).parent / "configs"
STUDY = {"models": ["m"], "actions": ["full"]}


def whitespace_tokens(text: str) -> int:
    return len(text.split())


def study(*tables: dict):
    return parse_study({"study": STUDY, "documents": [dict(t) for t in tables]})


def dumped(value) -> str:
    """JSON as run.json writes it: key order matters."""
    return json.dumps(value, indent=2)


# ------------------------------------------------------------------ the table each writes back

# (table as written, what as_dict must record): defaults left out stay out, given ones stay in,
# keys keep the order they were written in.
RECORDED = [
    ({"source": "ruler"}, {"source": "ruler"}),
    ({"per_stratum": 8, "source": "ruler", "seed": 0},
     {"per_stratum": 8, "source": "ruler", "seed": 0}),
    ({"seed": 3, "lengths": [600, 1000], "source": "ruler", "needle_types": ["uuid", "word"],
      "families": ["vt", "cwe"], "per_stratum": 2},
     {"seed": 3, "lengths": [600, 1000], "source": "ruler", "needle_types": ["uuid", "word"],
      "families": ["vt", "cwe"], "per_stratum": 2}),
    ({"path": "docs.jsonl", "source": "jsonl"}, {"path": "docs.jsonl", "source": "jsonl"}),
    ({"source": "hf", "name": "n", "split": "test", "prompt_field": "p"},
     {"source": "hf", "name": "n", "split": "test", "prompt_field": "p"}),
    ({"limit": 5, "name": "n", "source": "hf", "answer_field": "a", "split": "s",
      "prompt_field": "p", "stratum": "st", "id_field": "i"},
     {"limit": 5, "name": "n", "source": "hf", "answer_field": "a", "split": "s",
      "prompt_field": "p", "stratum": "st", "id_field": "i"}),
]


@pytest.mark.parametrize(("table", "recorded"), RECORDED)
def test_each_source_records_its_table_as_written(table, recorded):
    (source,) = study(table).documents
    assert dumped(source.as_dict()) == dumped(recorded)
    assert dumped(source_from_table(source.as_dict()).as_dict()) == dumped(recorded)
    assert source_from_table(table) == source


def test_study_record_is_unchanged():
    """The whole record of a study with one source of each kind, byte for byte."""
    config = study({"source": "ruler", "lengths": [512], "per_stratum": 1},
                   {"path": "d.jsonl", "source": "jsonl"},
                   {"source": "hf", "name": "n", "split": "test", "prompt_field": "p",
                    "limit": 2})
    expected = {
        "name": "study", "models": ["m"], "actions": ["full"], "replicates": 8, "horizon": 32,
        "temperature": 1.0, "estimator": "rollout", "depths": [], "seed": 0, "batch": 0,
        "device": "auto", "dtype": "float32", "chat_template": True,
        "documents": [{"source": "ruler", "lengths": [512], "per_stratum": 1},
                      {"path": "d.jsonl", "source": "jsonl"},
                      {"source": "hf", "name": "n", "split": "test", "prompt_field": "p",
                       "limit": 2}],
        "analysis": {"bootstrap": 2000, "alpha": 0.05, "endpoints": [], "seed": 0}}
    assert dumped(config.as_dict()) == dumped(expected)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_configs_record_their_tables(path):
    import tomllib

    tables = tomllib.loads(path.read_text())["documents"]
    config = load_study(path)
    assert dumped(config.as_dict()["documents"]) == dumped(tables)


def test_sources_built_in_code_record_every_key_they_hold():
    assert list(RulerSource().as_dict()) == list(SOURCE_KEYS["ruler"])
    assert RulerSource(RulerConfig(families=("vt",), target_lengths=(512,))).as_dict() == {
        "source": "ruler", "families": ["vt"], "needle_types": ["word", "number", "uuid"],
        "lengths": [512], "per_stratum": 8, "seed": 0, "question_after": False}
    assert dumped(HFSource("n", "s", "p", limit=3, id_field="i").as_dict()) == dumped(
        {"source": "hf", "name": "n", "split": "s", "prompt_field": "p", "id_field": "i",
         "limit": 3})
    assert JsonlSource("d.jsonl").as_dict() == {"source": "jsonl", "path": "d.jsonl"}
    # The canonical order of a source is the order of the table kind's allowed keys.
    full_hf = HFSource("n", "s", "p", "i", "sf", "st", "a", 1, "q")
    assert list(full_hf.as_dict()) == list(SOURCE_KEYS["hf"])
    assert list(JsonlSource("d").as_dict()) == list(SOURCE_KEYS["jsonl"])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RulerSource(RulerConfig(seed=4), table_keys=("source",)),
         "'seed' is left out of table_keys but its value 4 is not the default"),
        (lambda: HFSource("n", "s", "p", limit=2, table_keys=("source", "name", "split",
                                                                "prompt_field")),
         "'limit' is left out of table_keys but its value 2 is not the default"),
        (lambda: HFSource("n", "s", "p", table_keys=("source", "name", "split", "prompt_field",
                                                     "limit")),
         "'limit' is listed but has no value"),
        (lambda: JsonlSource("d", table_keys=("path",)), "'source' has no default"),
        (lambda: JsonlSource("d", table_keys=("source", "path", "path")), "must be distinct"),
        (lambda: JsonlSource("d", table_keys=("source", "path", "limit")), "must be distinct"),
    ],
)
def test_table_keys_must_describe_the_source(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match=whole(
            "document source must be one of ruler, jsonl, hf, records; got 'web'")):
        source_from_table({"source": "web"})


def test_only_ruler_needs_a_tokenizer():
    assert RulerSource.needs_tokenizer
    assert not JsonlSource.needs_tokenizer and not HFSource.needs_tokenizer
    with pytest.raises(TypeError, match="needs a tokenizer"):
        RulerSource().documents()


# ------------------------------------------------------------------ the documents each yields


def test_jsonl_source_yields_the_file(tmp_path):
    docs = [Document("a", "First prompt.", "s1", "x"), Document("b", "Second prompt.")]
    path = write_jsonl(docs, tmp_path / "docs.jsonl")
    (source,) = study({"source": "jsonl", "path": str(path)}).documents
    assert source.documents() == load_jsonl(path) == docs
    assert source.documents(whitespace_tokens) == docs  # the tokenizer is ignored


def test_ruler_source_yields_the_generated_documents():
    table = {"source": "ruler", "families": ["vt", "cwe"], "lengths": [600], "per_stratum": 2,
             "seed": 3}
    config = study(table)
    (source,) = config.documents
    assert source.config == RulerConfig(families=("vt", "cwe"), target_lengths=(600,),
                                        documents_per_stratum=2, seed=3)
    docs = source.documents(whitespace_tokens)
    assert docs == generate(source.config, whitespace_tokens)
    assert [d.id for d in docs] == ["ruler-vt-600-s3-000", "ruler-vt-600-s3-001",
                                    "ruler-cwe-600-s3-000", "ruler-cwe-600-s3-001"]
    assert fixed_documents(config) == []  # generated only once a model's tokenizer is known
    assert model_documents(config, [], whitespace_tokens) == docs


def test_ruler_source_sized_with_the_embedded_tokenizer():
    from kvdrift.lm.loading.model import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    config = study({"source": "ruler", "families": ["niah_single"], "lengths": [512],
                    "per_stratum": 1})
    docs = model_documents(config, [], tokenizer)
    assert docs == generate(RulerConfig(families=("niah_single",), target_lengths=(512,),
                                        documents_per_stratum=1), token_counter(tokenizer))
    count = token_counter(tokenizer)
    assert [d.id for d in docs] == ["ruler-niah_single-512-s0-000"]
    assert 0.9 * 512 <= count(docs[0].prompt) == docs[0].meta["n_tokens"] <= 512


@pytest.fixture
def saved_dataset(tmp_path, monkeypatch):
    """A dataset saved to disk (read offline with ``datasets.load_from_disk``)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    rows = [{"q": f"Question {i}?", "uid": f"u{i}", "gold": str(i)} for i in range(3)]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(saved))
    return saved


def test_hf_source_yields_the_dataset(saved_dataset):
    table = {"source": "hf", "name": str(saved_dataset), "split": "test", "prompt_field": "q",
             "id_field": "uid", "answer_field": "gold", "stratum": "quiz", "limit": 2}
    (source,) = study(table).documents
    docs = source.documents()
    assert docs == load_hf_dataset(str(saved_dataset), "test", "q", id_field="uid",
                                   answer_field="gold", stratum="quiz", limit=2)
    assert [(d.id, d.prompt, d.stratum, d.answer) for d in docs] == [
        ("u0", "Question 0?", "quiz", "0"), ("u1", "Question 1?", "quiz", "1")]
    plain = HFSource(str(saved_dataset), "test", "q").documents()
    assert [d.id for d in plain] == ["saved-test-0", "saved-test-1", "saved-test-2"]


def test_study_documents_keep_the_order_of_old_runs(tmp_path, saved_dataset):
    """Files and datasets first (in table order), then generated documents; ids unique."""
    path = write_jsonl([Document("j1", "A prompt.")], tmp_path / "docs.jsonl")
    ruler = {"source": "ruler", "families": ["vt"], "lengths": [512], "per_stratum": 1}
    config = study(ruler, {"source": "hf", "name": str(saved_dataset), "split": "test",
                           "prompt_field": "q", "limit": 1},
                   {"source": "jsonl", "path": str(path)})
    fixed = fixed_documents(config)
    assert [d.id for d in fixed] == ["saved-test-0", "j1"]
    docs = model_documents(config, fixed, whitespace_tokens)
    assert [d.id for d in docs] == ["saved-test-0", "j1", "ruler-vt-512-s0-000"]
    twice = study({"source": "jsonl", "path": str(path)}, {"source": "jsonl", "path": str(path)})
    with pytest.raises(ValueError, match="'j1' appears in two sources"):
        model_documents(twice, fixed_documents(twice), whitespace_tokens)
