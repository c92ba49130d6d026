"""Issues 61 (item 3) and 62 (class N5): every refusal that needs no model comes before torch,
transformers and kvpress are imported. Each press field of a spec is refused past the bound
kvpress asserts (or past what makes sense) and accepted at it, by the grammar alone, in the
full parser's words; and a resume with other documents, a changed converted config, a bad
``documents/`` part under ``kvdrift show`` and a prompt past the context window are refused
by the command line in a fresh interpreter with none of the three loaded (what was imported,
not how long it took)."""

from __future__ import annotations

import json
import typing

import pytest

from kvdrift import preflight
from kvdrift.data.document import Document, documents_sha256
from kvdrift.lm.grammar import stages
from kvdrift.lm.grammar.fields import LEVERAGE_TYPES, ActionError
from tests.test_hostile_refusals import fresh_cli

SPECS = [  # (spec, None: accepted, else the one-line refusal after "action '<spec>': ")
    # DecodingPress: compression_interval > 0, target_size > 0 (kvpress asserts)
    ("decoding-knorm:interval=1,target=1", None),
    ("decoding-knorm:interval=0,target=1", "decoding-KnormPress: interval must be an integer "
                                           ">= 1; got 0"),
    ("decoding-knorm:interval=1,target=0", "decoding-KnormPress: target must be an integer "
                                           ">= 1; got 0"),
    ("decoding-knorm:interval=1.5,target=1", "decoding-KnormPress: interval must be an "
                                             "integer >= 1; got 1.5"),
    (f"decoding-knorm:interval={2**31 - 1},target=1", None),
    (f"decoding-knorm:interval={2**31},target=1", "decoding-KnormPress: interval must be at "
     "most 2_147_483_647 in size (kvdrift's limit: what kvpress's C integers hold); got "
     "2_147_483_648"),
    # hidden_states_buffer_size: kvpress keeps none at 0, a negative one slices wrongly
    ("decoding-knorm:interval=1,target=1,buffer=0", None),
    ("decoding-knorm:interval=1,target=1,buffer=-1", "decoding-KnormPress: buffer must be an "
                                                     "integer >= 0; got -1"),
    # CompressionRatioDecodingPress: 0 <= 1 - ratio < 1 (kvpress asserts), in float64
    ("decoding-knorm:interval=4,ratio=1", None),
    ("decoding-knorm:interval=4,ratio=5.6e-17", None),
    ("decoding-knorm:interval=4,ratio=1e-17", "decoding-KnormPress: ratio must be large enough "
     "that the fraction removed, 1 - ratio, stays below 1 in float64 (kvpress asserts it: ratio "
     "above about 5.6e-17, at most 1); got 1e-17"),
    ("decoding-knorm:interval=4,ratio=5.55e-17", "decoding-KnormPress: ratio must be large "
     "enough that the fraction removed, 1 - ratio, stays below 1 in float64 (kvpress asserts "
     "it: ratio above about 5.6e-17, at most 1); got 5.55e-17"),
    ("decoding-knorm:interval=4,ratio=0", "decoding-KnormPress: ratio (fraction of entries "
     "kept) must be a number within (0, 1]; got 0.0"),
    ("decoding-knorm:interval=4,ratio=1.0000001", "decoding-KnormPress: ratio (fraction of "
     "entries kept) must be a number within (0, 1]; got 1.0000001"),
    ("decoding-adakv-knorm:interval=4,ratio=1e-17", "decoding-adakv-KnormPress: ratio must be "
     "large enough that the fraction removed, 1 - ratio, stays below 1 in float64 (kvpress "
     "asserts it: ratio above about 5.6e-17, at most 1); got 1e-17"),
    ("decoding-knorm:interval=4,ratio=0.5,target=3", "decoding-KnormPress: a decoding press "
     "takes target= (entries kept per layer and KV head) or ratio= (fraction of the tokens "
     "seen kept) and interval=, not ratio="),
    ("decoding-knorm:interval=4", "decoding-KnormPress: give target=T (entries kept after each "
     "decoding-time compression, >= 1) or ratio=R (fraction of the tokens seen kept, in (0, 1]) "
     "and interval=I (generated tokens between compressions)"),
    # AdaKVPress: 0 <= alpha_safeguard <= 1 (kvpress asserts)
    ("decoding-adakv-knorm:interval=4,target=4,alpha_safeguard=0", None),
    ("decoding-adakv-knorm:interval=4,target=4,alpha_safeguard=1", None),
    ("decoding-adakv-knorm:interval=4,target=4,alpha_safeguard=1.01", "decoding-adakv-"
     "KnormPress: alpha_safeguard must be a number within [0, 1]; got 1.01"),
    ("decoding-adakv-knorm:interval=4,target=4,alpha_safeguard=-0.01", "decoding-adakv-"
     "KnormPress: alpha_safeguard must be a number within [0, 1]; got -0.01"),
    ("adakv-snapkv:ratio=0.5,alpha_safeguard=1.5", "adakv-SnapKVPress: alpha_safeguard must "
     "be a number within [0, 1]; got 1.5"),
    # CAMPress: merge_budget > 0 (kvpress asserts); target= only
    ("cam-knorm:interval=4,target=4,merge=1", None),
    ("cam-knorm:interval=4,target=4,merge=0", "cam-KnormPress: merge must be an integer >= 1; "
                                              "got 0"),
    ("cam-knorm:interval=4,ratio=0.5", "cam-KnormPress: CAMPress takes target= (entries kept "
     "per layer and KV head) and interval=, not ratio="),
    # CriticalAdaKVPress's first stage, PyramidKV's beta (asserts >= 1), SnapKV's window
    ("criticaladakv-knorm:ratio=0.5,first_stage_ratio=1", None),
    ("criticaladakv-knorm:ratio=0.5,first_stage_ratio=0", "criticaladakv-KnormPress: "
     "first_stage_ratio must be a number within (0, 1]; got 0.0"),
    ("pyramidkv:ratio=0.5,beta=1", None),
    ("pyramidkv:ratio=0.5,beta=0", "pyramidkv-PyramidKVPress: beta must be an integer >= 1; "
                                   "got 0"),
    ("decoding-snapkv:interval=4,target=4,window_size=1,kernel_size=1", None),
    ("decoding-snapkv:interval=4,target=4,kernel_size=2", "decoding-SnapKVPress: kernel_size "
     "must be an odd integer >= 1; got 2"),
    ("decoding-streaming_llm:interval=4,target=4,n_sink=0", None),
    ("decoding-streaming_llm:interval=4,target=4,n_sink=-1", "decoding-StreamingLLMPress: "
     "n_sink must be an integer >= 0; got -1"),
    # fields kvpress only trips on mid-run: RandomPress's seed, CURPress's leverage type
    ("random:ratio=0.5,seed=-5", None),
    ("random:ratio=0.5,seed=none", None),
    ("random:ratio=0.5,seed=1.5", "RandomPress: seed must be an integer, or none; got 1.5"),
    ("random:ratio=0.5,seed=x", "RandomPress: seed must be an integer, or none; got 'x'"),
    ("cur:ratio=0.5,leverage_type=kv_avg", None),
    ("cur:ratio=0.5,leverage_type=nope", "CURPress: leverage_type must be one of key, value, "
                                         "kv_avg, kv_product; got 'nope'"),
    ("expected_attention:ratio=0.5,use_vnorm=no", None),
    ("expected_attention:ratio=0.5,use_covariance=maybe", "ExpectedAttentionPress field "
     "'use_covariance' must be true or false; got 'maybe'"),
    ("cap:ratio=0.5,tau=abc", "CapPress field 'tau' must be a number; got 'abc'"),
    # which fields and budget a stage takes, and where a decoding press goes
    ("snapkv:ratio=0.5,foo=1", "SnapKVPress field must be one of ratio, budget, window_size, "
                               "kernel_size; got 'foo'"),
    ("decoding-knorm:interval=4,target=4,alpha_safeguard=0.5", "decoding-KnormPress field "
     "must be one of interval, target, buffer; got 'alpha_safeguard'"),
    ("snapkv:ratio=0.5,budget=3", "SnapKVPress: give exactly one of ratio= or budget= (ratio: "
     "fraction of entries kept, in (0, 1]; budget: entries kept, >= 1; ratios: one kept "
     "fraction per layer, r_0/r_1/...)"),
    ("chunk-knorm:budget=3", "chunk-KnormPress: give exactly one of ratio= (ratio: fraction of "
     "entries kept, in (0, 1]; budget: entries kept, >= 1; ratios: one kept fraction per "
     "layer, r_0/r_1/...)"),
    ("snapkv:ratio=0.5,compression_ratio=0.3", "use ratio= (fraction kept) or budget= "
     "(entries kept), not compression_ratio"),
    ("decoding-knorm:interval=4,target=4+snapkv:ratio=0.5", "a decoding-* press must come "
                                                            "last"),
    ("criticalkv-observed_attention:ratio=0.5", None),
    ("adakv-observed_attention:ratio=0.5", "adakv-ObservedAttentionPress: kvpress's "
     "AdaKVPress asserts the attention is not eager, and the scorer reads the eager "
     "attention's weights (ObservedAttentionPress); score with another scorer, or drop the "
     "wrapper"),
    ("chunkkv-observed_attention:ratio=0.5", "chunkkv-ObservedAttentionPress: kvpress's "
     "ChunkKVPress scores chunk by chunk and asserts it is given no attention weights "
     "(ObservedAttentionPress); score with another scorer, or drop the wrapper"),
    ("snapkv:ratio=0.5+decoding-observed_attention:interval=2,target=4", "ObservedAttentionPress "
     "needs attention weights, which decoding steps do not return"),
    ("snapkv:ratio=0.5@smollm2", None),
    ("snapkv:ratio=2@smollm2", "SnapKVPress: ratio (fraction of entries kept) must be a number "
     "within (0, 1]; got 2.0"),
]


@pytest.mark.parametrize("spec, refusal", SPECS, ids=[s for s, _ in SPECS])
def test_each_field_is_held_at_its_bound_by_the_grammar_as_by_the_parser_and_kvpress(
        spec, refusal):
    from kvdrift.lm.actions.spec import parse_action

    if refusal is None:
        preflight.check_actions([spec])  # never refused early
        action = parse_action(spec)
        for stage in (*action.stages, *filter(None, [action.decoding])):
            stage.build(64)  # kvpress's own asserts pass at the bound
        return
    message = f"action {spec!r}: {refusal}"
    with pytest.raises(ActionError) as early:
        preflight.check_actions([spec])
    with pytest.raises(ValueError) as late:
        parse_action(spec)
    assert str(early.value) == message and "\n" not in message
    assert str(late.value) == message  # the same line, before and after kvpress loads


def test_the_grammar_s_copies_are_the_press_library_s():
    """The budgets, fields and kinds the grammar states without kvpress are those the press
    registry reads from the installed kvpress (so the early check cannot drift)."""
    import kvpress

    from kvdrift.lm.actions import presses

    assert stages.FAMILY_BUDGETS == {f.name: f.budgets for f in presses.FAMILIES.values()}
    assert set(stages.DECODING_FAMILIES) == {
        f.name for f in presses.FAMILIES.values() if f.is_decoding}
    assert stages.FAMILY_FIELDS == {
        f.name: {k: stages.field_kind(v) for k, v in f.wrapper_defaults().items()}
        for f in presses.FAMILIES.values()}
    scorers = {**presses.scorer_classes(), "PyramidKVPress": kvpress.PyramidKVPress}
    assert stages.SCORER_FIELDS == {
        name: {k: stages.field_kind(f.default) for k, f in presses.scorer_fields(cls).items()}
        for name, cls in scorers.items()}
    assert stages.FAMILY_WRAPPERS == {
        f.name: f.press.__name__ for f in presses.FAMILIES.values()
        if f.press is not None and not f.is_decoding
        and any(issubclass(f.press, c) for c in presses.REFUSES_ATTENTION_WEIGHTS)}
    hints = typing.get_type_hints(kvpress.CURPress)
    assert LEVERAGE_TYPES == typing.get_args(hints["leverage_type"])


def test_a_decoding_ratio_kvpress_refuses_is_refused_by_the_command_before_torch(tmp_path):
    (tmp_path / "docs.jsonl").write_text(DOCS)
    spec = "decoding-knorm:interval=4,ratio=1e-17"
    code, loaded, stderr, _ = fresh_cli("run", "--docs", "docs.jsonl", "--actions", spec,
                                        "--out", "out", cwd=tmp_path)
    assert code == 2 and loaded == [], (stderr, loaded)
    assert stderr.strip().splitlines() == [
        f"error: action {spec!r}: decoding-KnormPress: ratio must be large enough that the "
        "fraction removed, 1 - ratio, stays below 1 in float64 (kvpress asserts it: ratio "
        "above about 5.6e-17, at most 1); got 1e-17"]
    assert not (tmp_path / "out").exists()


DOCS = '{"id": "a", "prompt": "The cat sat on the mat. Where did the cat sit?"}\n'
OTHER = '{"id": "a", "prompt": "The dog sat on the mat. Where did the dog sit?"}\n'


def _store(tmp_path, hashed: bool):
    """A finished ``kvdrift run``'s run.json for ``docs.jsonl`` (its content hash recorded
    where ``hashed``, as every store since the hash was added)."""
    from kvdrift.data.loaders import load_jsonl

    (tmp_path / "docs.jsonl").write_text(DOCS)
    config = {"name": "store", "models": ["smollm2"], "actions": ["full"], "replicates": 2,
              "horizon": 4, "temperature": 1.0, "estimator": "rollout", "depths": [],
              "seed": 0, "batch": 0, "device": "auto", "dtype": "float32",
              "chat_template": True, "documents": [{"source": "jsonl", "path": "docs.jsonl"}]}
    if hashed:
        config["documents_sha256"] = documents_sha256(load_jsonl(tmp_path / "docs.jsonl"))
    store = tmp_path / "store"
    store.mkdir()
    (store / "run.json").write_text(json.dumps({"config": config, "versions": {}}))
    (store / ".kvdrift").write_text("kvdrift run\n")
    return store


RUN = ("run", "--actions", "full", "--replicates", "2", "--horizon", "4", "--out", "store")


@pytest.mark.parametrize("hashed", [True, False], ids=["by-content", "by-path"])
def test_a_resume_with_other_documents_is_refused_before_torch(tmp_path, hashed):
    _store(tmp_path, hashed)
    (tmp_path / "other.jsonl").write_text(OTHER)
    code, loaded, stderr, _ = fresh_cli(*RUN, "--docs", "other.jsonl", cwd=tmp_path)
    assert code == 2 and loaded == [], (stderr, loaded)
    assert stderr.strip() == ("error: store holds a run with a different configuration "
                              "(differs in: documents); rerun with the same arguments to "
                              "resume, or use another output directory")


def test_the_same_documents_from_another_path_still_resume(tmp_path):
    """The early check compares what the store compares: content, not the path, where the
    store recorded the hash (a copy of the file resumes); the path where it did not."""
    from kvdrift.study_config import single_model_study

    (tmp_path / "copy.jsonl").write_text(DOCS)
    store = _store(tmp_path, hashed=True)
    settings = dict(model="smollm2", actions=("full",), replicates=2, horizon=4,
                    temperature=1.0, estimator="rollout", depths=(), seed=0, batch=0,
                    device="auto", dtype="float32", chat_template=True)
    seen = []
    single_model_study(docs=tmp_path / "copy.jsonl", before_torch=seen.append, **settings)
    preflight.check_resume(store, seen[0])  # no refusal
    (store / "run.json").write_text(json.dumps({"config": {
        k: v for k, v in json.loads((store / "run.json").read_text())["config"].items()
        if k != "documents_sha256"}, "versions": {}}))
    with pytest.raises(ValueError, match=r"differs in: documents\)"):
        preflight.check_resume(store, seen[0])  # an older store: the path decides


def _fake_conversion(tmp_path, monkeypatch):
    """A converted folder sealed as kvdrift seals one (its files faked: no weights)."""
    from kvdrift.lm.loading import converted_cache, embedded

    root = tmp_path / "cache"
    monkeypatch.setenv("KVDRIFT_CACHE", str(root))
    folder = embedded.smollm2_cache_dir()
    folder.mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"weights" * 100)
    converted_cache.write_manifest(folder, embedded.smollm2_gguf_digest(),
                                   converted_cache.user_key(root))
    return folder


def test_a_changed_converted_config_is_refused_before_torch(tmp_path, monkeypatch):
    from kvdrift.lm.loading import embedded

    folder = _fake_conversion(tmp_path, monkeypatch)
    embedded.check_cache()  # as sealed: accepted (the weights are not read here)
    (folder / "model.safetensors").write_bytes(b"W" * 700)
    embedded.check_cache()  # weights: checked as they load, not here
    (folder / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    (tmp_path / "docs.jsonl").write_text(DOCS)
    code, loaded, stderr, _ = fresh_cli("run", "--docs", "docs.jsonl", "--actions", "full",
                                        "--out", "out", cwd=tmp_path)
    assert code == 2 and loaded == [], (stderr, loaded)
    assert stderr.strip() == (f"error: converted-weights cache {folder}: 'config.json' does "
                              f"not match the SHA-256 recorded when it was converted (changed "
                              f"since); delete {folder} to convert the model again")
    assert not (tmp_path / "out").exists()


def test_show_refuses_a_bad_documents_part_before_torch_and_pandas(tmp_path):
    store = _store(tmp_path, hashed=True)
    (store / "documents").mkdir()
    (store / "documents" / "a-1b90599a4125.parquet").write_text("not parquet")
    code, loaded, stderr, _ = fresh_cli("show", "store", cwd=tmp_path)
    assert code == 2 and loaded == [], (stderr, loaded)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: store/documents/a-1b90599a4125.parquet is unreadable ("), stderr
    assert lines[0].endswith("rerun the run or study command to record it again")


LONG = " ".join(["The quick brown fox jumps over the lazy dog."] * 1000)  # 10_000 tokens


@pytest.fixture(scope="module")
def converted():
    """The embedded model's converted folder (converted here if it is not yet)."""
    from kvdrift.lm.loading.model import smollm2_path

    return smollm2_path()


@pytest.mark.parametrize("record, doc_id, tokens", [
    ({"id": "long", "prompt": LONG}, "long", 10_030),
    ({"id": "c", "context": LONG, "questions": ["What jumps?", "Over what?"]}, "c:q1", 10_033),
], ids=["prompt", "context-questions"])
def test_a_prompt_past_the_context_window_is_refused_before_torch(tmp_path, converted, record,
                                                                  doc_id, tokens):
    (tmp_path / "docs.jsonl").write_text(DOCS + json.dumps(record) + "\n")
    code, loaded, stderr, _ = fresh_cli("run", "--docs", "docs.jsonl", "--actions", "full",
                                        "--horizon", "2", "--out", "out", cwd=tmp_path)
    assert code == 2 and loaded == [], (stderr, loaded)
    assert stderr.strip() == (f"error: document {doc_id!r} has {tokens} prompt tokens; with "
                              f"H = 2 generated positions that exceeds smollm2's context window "
                              f"of 8192 tokens (allowed: prompt tokens <= 8190)")
    assert not (tmp_path / "out").exists()


TEXTS = ["The cat sat.", " leading space", "\n\nnewlines first", "naïve café 東京 🙂",
         "<|im_end|> injected", "ends in a space ", "tab\tsep\r\nCRLF", "1234567890 digits",
         LONG[:2000]]


@pytest.mark.parametrize("chat_template", [True, False])
def test_the_early_count_is_the_tokenizer_s_own(converted, chat_template):
    """The count made without torch is transformers' count, for whole prompts and for a
    context with the question asked after it (the two parts encoded apart)."""
    from kvdrift.lm.loading.model import encode_prompt, encode_split, load_tokenizer
    from kvdrift.lm.loading.prompt_fit import embedded_counter

    counter, window = embedded_counter()
    tokenizer = load_tokenizer("smollm2")
    assert window == 8192
    for text in TEXTS:
        whole = Document(id="w", prompt=text)
        assert counter.count(whole, chat_template) == encode_prompt(
            tokenizer, text, chat_template).shape[-1], text
        for question in ("Where?", " spaced", "\nq"):
            asked = Document(id="q", prompt=text, question=question)
            late = sum(p.shape[-1] for p in encode_split(tokenizer, text, question,
                                                         chat_template))
            assert counter.count(asked, chat_template) == late, (text, question)
