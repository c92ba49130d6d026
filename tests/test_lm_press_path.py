"""The general path: any kvpress press object as an action (lm/engine/press_path.py, issue 43).

Q's cache is the prompt's prefill run inside the press object, used as the press left it. It is
checked against kvpress's own ``generate`` inside the same press (a press written here, not a
kvpress class, and kvpress classes kvdrift formerly refused), and against the shared prefill on
every kind of action kvdrift names: fed ``action.make_press(n)``, the general path gives the
same records.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass

import kvpress
import pyarrow.compute as pc
import pytest
import torch
from transformers import DynamicCache
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data.document import Document
from kvdrift.lm.actions.identity import check_press, identity_changes, press_identity
from kvdrift.lm.actions.spec import NAMED_ACTIONS, Action, parse_action
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.engine.press_path import (
    KEPT_ENTRIES,
    STORED_BYTES,
    PressFailed,
    press_prompt_cache,
)
from kvdrift.lm.factory import LMPairFactory
from kvdrift.lm.loading.model import load_model
from kvdrift.run.runner import RunConfig, run_units, unit_records
from kvdrift.run.store import RunStore
from tests.test_lm_presses import prompt

EOS = 2  # the tiny Llama's (and SmolLM2's <|im_end|>)
STEPS = 48


@dataclass
class ValueNormPress(kvpress.ScorerPress):
    """A user's own scorer: keep the entries whose values are largest (not a kvpress class)."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return values.norm(dim=-1) - 0.5 * keys.norm(dim=-1)


@dataclass
class RaisingPress(kvpress.ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        raise ZeroDivisionError("the user's score divided by zero\nsecond line")


@dataclass
class NaNPress(kvpress.BasePress):
    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys * float("nan"), values


@dataclass
class EmptyPress(kvpress.BasePress):
    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys[:, :, :0], values[:, :, :0]


@dataclass
class NarrowPress(kvpress.BasePress):
    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys[..., :4], values


def greedy_q(pair: LMKernelPair, steps: int) -> list[int]:
    """Q's greedy tokens, EOS never chosen (as generate's min_new_tokens does)."""
    state, tokens = pair.start("q", 1), []
    for _ in range(steps):
        lp = pair.logprobs(state)[0].clone()
        lp[EOS] = -torch.inf
        tokens.append(int(lp.argmax()))
        state = pair.advance(state, torch.tensor([tokens[-1]]))
    return tokens


def generate_in(model, ids: torch.Tensor, press, steps: int, eos_allowed: bool = False):
    """kvpress's documented usage: ``with press(model): model.generate(...)``, greedy."""
    ctx = press(model) if press is not None else contextlib.nullcontext()
    with ctx, torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=steps,
                             min_new_tokens=1 if eos_allowed else steps)
    return out[0, ids.shape[1]:].tolist()


def general_pair(model, ids, press, name="mine") -> LMKernelPair:
    return LMKernelPair(model, ids, Action(name=name),
                        general=press_prompt_cache(model, ids, press, name, "doc"))


# --- a press of the user's own, against generate inside it --------------------------------

@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_dir):
    return load_model(str(tiny_model_dir), "cpu", "float32")


DOC = Document(id="d0", prompt=" ".join(f"word{i} is here, and the story goes on" for i in
                                        range(12)))


def test_a_users_scorer_press_equals_generate_inside_it(tiny_loaded):
    """Through the runner at temperature 0: X is generate's, Y is generate's inside the press,
    token for token over 48 positions."""
    press = ValueNormPress(compression_ratio=0.6)
    factory = LMPairFactory(tiny_loaded, presses={"mine": press})
    config = RunConfig(model="tiny", actions=("mine",), replicates=1, horizon=STEPS,
                       temperature=0.0)
    steps, reps = unit_records(config, DOC, "mine", factory)
    ids = factory.prompt_ids(DOC)
    model = tiny_loaded.model
    want_x = generate_in(model, ids, None, STEPS, eos_allowed=True)
    want_y = generate_in(model, ids, press, STEPS, eos_allowed=True)
    assert len(want_x) == len(want_y) == STEPS  # no EOS: all 48 positions compared
    assert steps.column("x_token").to_pylist() == want_x
    assert steps.column("y_token").to_pylist() == want_y
    assert want_x != want_y  # the press changed what Q generates
    assert reps.column("kv_measure").to_pylist() == [STORED_BYTES]
    kept = 1 - 0.6
    assert reps.column("kv_fraction").to_pylist()[0] == pytest.approx(kept, abs=0.02)


@dataclass
class EveryFewTokensPress(kvpress.DecodingPress):
    """A user's DecodingPress subclass that keeps kvpress's decoding-time rule."""


def test_a_users_decoding_press_equals_generate_inside_it(tiny_llama):
    """A user's scorer at prefill, then a user's DecodingPress subclass with it compressing
    every 4 generated tokens to 40 entries: Q equals generate inside the same press."""
    def make():
        return kvpress.PrefillDecodingPress(
            prefilling_press=ValueNormPress(compression_ratio=0.5),
            decoding_press=EveryFewTokensPress(base_press=ValueNormPress(),
                                               compression_interval=4, target_size=40))
    ids = prompt(60)
    pair = general_pair(tiny_llama, ids, make())
    assert greedy_q(pair, STEPS) == generate_in(tiny_llama, ids, make(), STEPS)
    assert pair.kv_memory()[1] == pytest.approx(0.5)  # the prompt cache: at prefill


# --- the general path against the shared prefill, on every kind of named action ----------

SPECS = [name for name, named in NAMED_ACTIONS.items() if named.spec] + [
    "knorm:ratio=0.5", "observed_attention:ratio=0.5", "random:ratio=0.4,seed=0",
    "expected_attention:budget=20", "adakv-snapkv:ratio=0.5", "criticaladakv-knorm:ratio=0.5",
    "criticalkv-knorm:ratio=0.5", "block-knorm:ratio=0.5,block_size=8",
    "rerotate-knorm:ratio=0.5", "chunk-knorm:ratio=0.5,chunk_length=16",
    "chunkkv-snapkv:ratio=0.5,chunk_length=8", "pyramidkv:ratio=0.5",
    "perlayer-knorm:ratios=0.9/0.3", "snapkv:ratio=0.8+knorm:ratio=0.5",
    "decoding-knorm:interval=4,target=40", "snapkv:ratio=0.5+decoding-knorm:interval=5,target=30",
]


def test_the_general_path_gives_the_shared_prefills_records(tiny_loaded):
    """Fed each named action's own kvpress press, the general path gives the same tokens and,
    within float noise, the same TVs as the fast shared prefill (quantizations are kvdrift's
    own, not presses: they have no press object to compare)."""
    config = RunConfig(model="tiny", actions=("x",), replicates=2, horizon=6, seed=3)
    n = int(LMPairFactory(tiny_loaded).prompt_ids(DOC).shape[-1])
    checked = 0
    for spec in SPECS:
        press = parse_action(spec).make_press(n)
        if press is None:  # keeps every entry of this prompt (snapkv-512 on a short one)
            continue
        fast = unit_records(config, DOC, spec, LMPairFactory(tiny_loaded))
        general = unit_records(config, DOC, spec, LMPairFactory(tiny_loaded,
                                                                presses={spec: press}))
        for column in ("x_token", "y_token", "mismatch", "tau"):
            assert fast[0].column(column).equals(general[0].column(column)), (spec, column)
        for column in ("delta", "f"):
            diff = pc.max(pc.abs(pc.subtract(fast[0].column(column),
                                             general[0].column(column)))).as_py()
            assert diff < 1e-5, (spec, column, diff)
        assert fast[1].column("kv_measure").to_pylist()[0] == KEPT_ENTRIES
        assert general[1].column("kv_measure").to_pylist()[0] == STORED_BYTES
        if "adakv" not in spec:  # head-adaptive: the named action counts its hidden entries
            assert general[1].column("kv_fraction").to_pylist() == pytest.approx(
                fast[1].column("kv_fraction").to_pylist(), rel=1e-9), spec
        checked += 1
    assert checked >= len(SPECS) - 1


# --- kvpress classes that kvdrift refused before ------------------------------------------

REFUSED_BEFORE = {
    # values change
    "merging": lambda: kvpress.MergingPress(press=kvpress.KnormPress(compression_ratio=0.5)),
    # key channels pruned
    "think": lambda: kvpress.ThinKPress(key_channel_compression_ratio=0.5, window_size=8),
    # its own scoring over the whole prompt (prefill only)
    "compactor": lambda: kvpress.CompactorPress(compression_ratio=0.5, sink_size_start=4,
                                                chunk_size=32, sketch_dimension=16),
    # a score threshold, hidden per KV head
    "dms": lambda: kvpress.DMSPress(press=kvpress.KnormPress(), threshold=-7.0,
                                    sliding_window_size=16),
    # lazy layers keep sinks and recent entries
    "simlayerkv": lambda: kvpress.SimLayerKVPress(lazy_threshold=0.1, n_recent=16, n_initial=4),
    # chunk sizes follow an entropy threshold
    "entropy-chunkkv": lambda: kvpress.EntropyGatedChunkKVPress(
        press=kvpress.KnormPress(compression_ratio=0.5)),
}


@pytest.mark.parametrize("name", sorted(REFUSED_BEFORE))
def test_formerly_refused_presses_equal_generate_inside_them(tiny_llama, name):
    ids = prompt(100)
    pair = general_pair(tiny_llama, ids, REFUSED_BEFORE[name](), name)
    torch.manual_seed(0)
    assert greedy_q(pair, STEPS) == generate_in(tiny_llama, ids, REFUSED_BEFORE[name](), STEPS)
    kv_fraction = pair.kv_memory()[1]
    assert 0 < kv_fraction < 1, (name, kv_fraction)
    if name == "think":  # every entry kept, half the key channels: 3/4 of the bytes
        assert pair.prompt_cache("q").is_full and kv_fraction == pytest.approx(0.75)
    if name == "merging":  # the kept entries' values are merged, not P's
        q = pair.prompt_cache("q")
        p = pair.prompt_cache("p")
        assert not any(bool((p.values[0][0, :, None] == v[:, :, None]).all(-1).any(-1).all())
                       for v in q.values[0])


def pipeline_greedy(model, ids: torch.Tensor, press, steps: int) -> list[int]:
    """kvpress's pipeline: the prompt's prefill inside the press, then greedy steps outside it
    over the cache it left (kvpress's attention patch hides what it masked), EOS never
    chosen. The reference for presses that compress when their context exits, which
    ``generate`` inside the press would decode before."""
    cache = DynamicCache(config=model.config)
    tokens = []
    with torch.no_grad():
        with press(model):
            logits = model(input_ids=ids, past_key_values=cache).logits[0, -1]
        for t in range(steps):
            logits[EOS] = -torch.inf
            tokens.append(int(logits.argmax()))
            logits = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache,
                           position_ids=torch.tensor([[ids.shape[1] + t]])).logits[0, -1]
    for module in model.modules():  # kvpress leaves its masks on the modules
        if getattr(module, "masked_key_indices", None) is not None:
            module.masked_key_indices = None
    return tokens


@pytest.mark.parametrize("make", [
    lambda: kvpress.KVzipPress(compression_ratio=0.5),  # head-adaptive: per KV head masks
    lambda: kvpress.KVgradPress(compression_ratio=0.5),  # as KVzip, with gradients
    lambda: kvpress.KVComposePress(compression_ratio=0.5),  # eager re-run, one count per layer
], ids=["kvzip", "kvgrad", "kvcompose"])
def test_presses_with_their_own_prefill_equal_kvpress_pipeline(tiny_loaded, make):
    """KVzip (and KVgrad, with gradients) re-run the context to score it, KVCompose re-runs
    the prompt with eager attention; all compress when their context exits."""
    ids = LMPairFactory(tiny_loaded).prompt_ids(DOC)
    pair = general_pair(tiny_loaded.model, ids, make())
    assert greedy_q(pair, 24) == pipeline_greedy(tiny_loaded.model, ids, make(), 24)
    assert pair.kv_memory()[1] == pytest.approx(0.5, abs=0.02)


def test_a_press_with_its_own_prefill_runs_end_to_end(tiny_loaded, tmp_path):
    """Through the runner into a store: KVCompose (its own re-run of the prompt) and a
    composition that prunes entries, then key channels."""
    presses = {"kvcompose": kvpress.KVComposePress(compression_ratio=0.5),
               "think-snapkv": kvpress.ComposedPress([
                   kvpress.SnapKVPress(compression_ratio=0.5, window_size=8),
                   kvpress.ThinKPress(key_channel_compression_ratio=0.25, window_size=8)])}
    config = RunConfig(model="tiny", actions=tuple(presses), replicates=2, horizon=6)
    store = RunStore.open(tmp_path / "run", config.as_dict())
    assert run_units(config, [DOC], LMPairFactory(tiny_loaded, presses=presses), store) == 2
    reps = store.read("replicates").to_pandas()
    fraction = reps.groupby("action")["kv_fraction"].first()
    assert fraction["kvcompose"] == pytest.approx(0.5, abs=0.05)
    assert fraction["think-snapkv"] == pytest.approx(0.5 * (1 - 0.25 / 2), abs=0.02)
    assert set(reps["kv_measure"]) == {STORED_BYTES}


# --- a broken press is one line, and nothing is lost -------------------------------------

@pytest.mark.parametrize(("press", "says"), [
    (RaisingPress(compression_ratio=0.5),
     "the press raised ZeroDivisionError: the user's score divided by zero"),
    (NaNPress(), "layer 0 holds non-finite keys or values"),
    (EmptyPress(), "layer 0 keeps nothing in a KV head"),
    (NarrowPress(), "layer 0 holds keys and values of 4 and 8 channels"),
    (kvpress.DecodingPress(base_press=RaisingPress(), compression_interval=2, target_size=10),
     "its DecodingPress: RaisingPress cannot score during decoding (ZeroDivisionError: the "
     "user's score divided by zero)"),
])
def test_a_broken_press_stops_its_unit_in_one_line(tiny_loaded, tmp_path, press, says):
    config = RunConfig(model="tiny", actions=("snapkv-half", "broken"), replicates=2,
                       horizon=4)
    store = RunStore.open(tmp_path / "run", config.as_dict())
    factory = LMPairFactory(tiny_loaded, presses={"broken": press})
    with pytest.raises(PressFailed) as info:
        run_units(config, [DOC], factory, store)
    message = str(info.value)
    assert "\n" not in message and says in message
    assert "action 'broken'" in message and "document 'd0'" in message
    assert "the unit is not stored" in message
    assert set(store.read("replicates").column("action").to_pylist()) == {"snapkv-half"}
    # the model is as it was: the next command (a good press, on the same model) runs
    factory = LMPairFactory(tiny_loaded, presses={"broken": ValueNormPress(0.5)})
    assert run_units(config, [DOC], factory, store) == 1
    assert set(store.read("replicates").column("action").to_pylist()) == {"snapkv-half",
                                                                          "broken"}


def test_a_hub_trained_press_without_its_files_names_them(tiny_loaded, tiny_model_dir):
    """On a model loaded from a local folder, a hub-trained press cannot find its files by
    construction (its hub id comes from the folder's name): the refusal says so, and how to
    supply them; on a model named by a hub id, the missing file is named."""
    ids = LMPairFactory(tiny_loaded).prompt_ids(DOC)
    with pytest.raises(PressFailed) as info:
        press_prompt_cache(tiny_loaded, ids, kvpress.QFilterPress(compression_ratio=0.5), "q",
                           "d0")
    message = str(info.value)
    assert "\n" not in message
    assert (f"it looks for nthngdy/{tiny_model_dir.name}_qfilt" in message
            and f"from the model's folder name ({tiny_model_dir.name!r}); a model loaded from a "
                "local folder has no hub id, so it cannot find its files by construction"
            in message and "set its q_filters (QFilters.from_pretrained(" in message)
    stats = kvpress.ExpectedAttentionStatsPress()
    tiny_loaded.model.config.name_or_path = "someorg/some-model"
    try:
        with pytest.raises(PressFailed) as info:
            press_prompt_cache(tiny_loaded, ids, stats, "s", "d0")
    finally:
        tiny_loaded.model.config.name_or_path = str(tiny_model_dir)
    assert "from the Hugging Face hub, which is not in the local cache (give " \
        "ExpectedAttentionStatsPress stats_folder=" in str(info.value)


# --- what a press is ------------------------------------------------------------------------

def test_check_press_refuses_what_is_not_a_press_object():
    check_press(ValueNormPress(0.5), "mine")
    with pytest.raises(ValueError, match=r"^action 'mine': ValueNormPress is a press class, "
                                         r"not a press object; call it"):
        check_press(ValueNormPress, "mine")
    with pytest.raises(ValueError, match=r"^action 'x': a builtins.str is not a kvpress press; "
                                         r"allowed: an instance of a kvpress press class"):
        check_press("snapkv-half", "x")


def test_press_identity_names_class_fields_and_source():
    composed = kvpress.ComposedPress([ValueNormPress(0.5), kvpress.ThinKPress(0.25)])
    ident = press_identity(composed)
    assert ident["class"] == "kvpress.presses.composed_press.ComposedPress"
    assert ident["source"].startswith("kvpress ")
    inner = ident["fields"]["presses"][0]
    assert inner["class"].endswith("test_lm_press_path.ValueNormPress")
    assert inner["fields"] == {"compression_ratio": 0.5} and len(inner["source"]) == 64
    other = press_identity(kvpress.ComposedPress([ValueNormPress(0.25),
                                                  kvpress.ThinKPress(0.25)]))
    assert identity_changes(ident, other) == "field presses[0].compression_ratio 0.5 -> 0.25"
    assert identity_changes(ident, ident) == "nothing"
    swapped = press_identity(kvpress.SnapKVPress(0.5))
    assert identity_changes(press_identity(ValueNormPress(0.5)), swapped) == (
        f"class {ValueNormPress.__module__}.ValueNormPress -> "
        "kvpress.presses.snapkv_press.SnapKVPress")


def test_an_edited_press_source_changes_its_identity(tmp_path, monkeypatch):
    module = tmp_path / "my_presses_i43a.py"
    source = ("from dataclasses import dataclass\nimport kvpress\n\n@dataclass\n"
              "class MyPress(kvpress.ScorerPress):\n    def score(self, module, h, k, v, a, kw):\n"
              "        return k.norm(dim=-1)\n")
    module.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        first = press_identity(importlib.import_module("my_presses_i43a").MyPress(0.5))
        module.write_text(source.replace("k.norm", "v.norm"))
        edited = importlib.reload(sys.modules["my_presses_i43a"])
        second = press_identity(edited.MyPress(0.5))
    finally:
        sys.modules.pop("my_presses_i43a", None)
    assert first["fields"] == second["fields"]
    assert identity_changes(first, second) == "source of my_presses_i43a.MyPress changed"


def test_kvdrift_actions_says_how_each_class_is_measured():
    result = CliRunner().invoke(app, ["actions"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines()
             if line.startswith("  ") and line.split()[0].endswith("Press")
             and ":" not in line.split()[0]}
    for name in ("ThinKPress", "MergingPress", "DMSPress", "SimLayerKVPress", "KVComposePress",
                 "CompactorPress", "ScorerPress"):
        assert "general path" in lines[name], name
    assert "shared prefill: snapkv:ratio=R" in lines["SnapKVPress"]
    assert "not offered" in lines["FinchPress"]


# --- SmolLM2 -------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("make", [
    lambda: ValueNormPress(compression_ratio=0.5),
    lambda: kvpress.ThinKPress(key_channel_compression_ratio=0.5),
    lambda: kvpress.MergingPress(press=kvpress.SnapKVPress(compression_ratio=0.5)),
], ids=["users-scorer", "think", "merging"])
def test_presses_on_smollm2_equal_generate_inside_them(make, embedded_smollm2):
    from kvdrift.lm.loading.model import encode_prompt

    loaded = embedded_smollm2
    text = ("Rivers carve valleys over millennia; glaciers widen them, and the sea floods "
            "their mouths when the ice melts. ") * 6 + "Explain how a fjord forms."
    ids = encode_prompt(loaded.tokenizer, text)
    pair = general_pair(loaded.model, ids, make())
    assert greedy_q(pair, STEPS) == generate_in(loaded.model, ids, make(), STEPS)
