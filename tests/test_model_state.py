"""A press must leave the model as it found it, and score in the shape it is ranked by (issue 61).

A press that edited the model's config, a rotary buffer or setting, its attention
implementation, or left a hook or a ``forward`` of its own behind ran with rc 0: its records
were written and every later unit (and the model a Python caller got back) ran on another
model than the one named. Now the unit stops in one line naming the action and the change,
nothing of it is stored, and the model is put back: the next unit is what it was before
(:mod:`kvdrift.lm.model_state`). A scorer of one's own returning scores of another shape,
dtype or device ended in ``selected index k out of range``; now it is one line naming the
action and the shape expected (:mod:`kvdrift.lm.engine.score_shapes`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import kvpress
import pytest
import torch

from kvdrift.data.document import Document
from kvdrift.lm.engine.press_path import PressFailed, press_prompt_cache
from kvdrift.lm.factory import LMPairFactory
from kvdrift.lm.loading.digest import weights_digest
from kvdrift.lm.loading.model import load_model
from kvdrift.lm.model_state import ModelState
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore
from tests.test_lm_press_path import general_pair, greedy_q

DOC = Document(id="d0", prompt=" ".join(f"word{i} is here, and the story goes on"
                                        for i in range(12)))


def leftover_hook(module, args, output=None):
    """A hook a press registers and never removes (it changes nothing: being there is all)."""


def identity_forward(x):
    return x


def other_attention(module) -> str:
    return "eager" if module.config._attn_implementation != "eager" else "sdpa"


#: What a press does to the model from inside its ``score`` (first layer only), and what the
#: refusal must then say: the kind of state, and the change in words.
CHANGES = {
    "config field": (
        lambda m: m.config.rope_parameters.__setitem__("rope_theta", 5.0),
        "config", "rope_parameters.rope_theta 10000.0 -> 5.0"),
    "config count": (
        lambda m: setattr(m.config, "num_key_value_heads", 1),
        "config", "num_key_value_heads 2 -> 1"),
    "rotary buffer": (
        lambda m: m.rotary_emb.inv_freq.mul_(2),
        "buffers", "model.rotary_emb.inv_freq values changed"),
    "rotary setting": (
        lambda m: setattr(m.rotary_emb, "attention_scaling", 2.0),
        "module settings", "model.rotary_emb.attention_scaling 1.0 -> 2.0"),
    "forward hook": (
        lambda m: m.o_proj.register_forward_hook(leftover_hook),
        "hooks", "a forward hook left on model.layers.0.self_attn.o_proj (leftover_hook)"),
    "forward pre-hook": (
        lambda m: m.register_forward_pre_hook(leftover_hook),
        "hooks", "a forward pre-hook left on model.layers.0.self_attn (leftover_hook)"),
    "training mode": (
        lambda m: m.train(),
        "module settings", "model.layers.0.self_attn.training False -> True (and 5 more "
                           "modules)"),
    "attention implementation": (
        lambda m: setattr(m.config, "_attn_implementation", other_attention(m)),
        "attention implementation", None),  # sdpa -> eager, or back
    "forward": (
        lambda m: setattr(m.o_proj, "forward", identity_forward),
        "forward methods", "model.layers.0.self_attn.o_proj.forward replaced by "
                           "identity_forward"),
}


@dataclass
class ChangingPress(kvpress.ScorerPress):
    """Scores by key norm, and changes the model (``CHANGES[change]``) while at it."""

    change: str = "config field"

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        if module.layer_idx == 0:
            CHANGES[self.change][0](module)
        return keys.norm(dim=-1)


@dataclass
class QuietPress(kvpress.ScorerPress):
    """The same scores, the model left alone."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys.norm(dim=-1)


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_dir):
    return load_model(str(tiny_model_dir), "cpu", "float32")


def at_prefill(change):
    return ChangingPress(compression_ratio=0.5, change=change)


def during_decoding(change):
    """The change made by a decoding press's scorer, during generation (after its prefill)."""
    return kvpress.DecodingPress(base_press=ChangingPress(change=change),
                                 compression_interval=2, target_size=10)


@pytest.mark.parametrize(("when", "change"), [
    *((at_prefill, change) for change in CHANGES),
    (during_decoding, "config field"), (during_decoding, "rotary setting"),
])
def test_a_press_that_changes_the_model_stops_its_unit_and_the_model_is_put_back(
        tiny_loaded, tmp_path, when, change):
    model = tiny_loaded.model
    before, weights = ModelState.of(model), weights_digest(model)
    _, kind, detail = CHANGES[change]
    if detail is None:  # the attention implementation, whichever way it goes
        detail = f"{model.config._attn_implementation} -> " \
                 f"{other_attention(model.model.layers[0].self_attn)}"
    press = when(change)
    config = RunConfig(model="tiny", actions=("quiet", "bad"), replicates=2, horizon=4)
    store = RunStore.open(tmp_path / "run", config.as_dict())
    factory = LMPairFactory(tiny_loaded, presses={"quiet": QuietPress(0.5), "bad": press})
    with pytest.raises(PressFailed) as info:
        run_units(config, [DOC], factory, store)
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith(f"action 'bad' ({type(press).__name__}) changed the model's {kind} "
                           f"on document 'd0': {detail}"), line
    assert line.endswith("a press must leave the model as it found it (kvdrift has put it "
                         "back); the unit is not stored and the run stops here (finished units "
                         "are kept)"), line
    assert store.read("replicates").column("action").unique().to_pylist() == ["quiet"]
    # the model is the one named again: nothing differs, and the next unit is as before
    assert before.changes() == () and weights_digest(model) == weights
    assert model.config.rope_parameters["rope_theta"] == 10000.0
    again = RunStore.open(tmp_path / "again", config.as_dict())
    assert run_units(RunConfig(model="tiny", actions=("quiet",), replicates=2, horizon=4),
                     [DOC], LMPairFactory(tiny_loaded, presses={"quiet": QuietPress(0.5)}),
                     again) == 1
    assert drift(again) == drift(store)


def drift(store: RunStore) -> list:
    """The quiet unit's steps (every column that does not time the unit)."""
    return store.read("steps").to_pylist()


@pytest.mark.parametrize("change", CHANGES)
def test_the_press_path_alone_refuses_the_change_and_puts_the_model_back(tiny_llama, change):
    """``press_prompt_cache`` without a runner around it (no factory to put the model back)."""
    model = copy.deepcopy(tiny_llama)  # the session's own model is never touched here
    before = ModelState.of(model)
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    with pytest.raises(PressFailed, match=rf"^action 'mine' \(ChangingPress\) changed the "
                                          rf"model's {CHANGES[change][1]} on document 'd0': "):
        press_prompt_cache(model, ids, at_prefill(change), "mine", "d0")
    assert before.changes() == ()


def test_a_press_that_changes_the_model_and_raises_leaves_it_as_it_was(tiny_loaded,
                                                                        tmp_path):
    """The press's own error is its line; the model is put back all the same."""

    @dataclass
    class BreakingPress(kvpress.ScorerPress):
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            module.config.rope_parameters["rope_theta"] = 5.0
            module.register_forward_pre_hook(leftover_hook)
            raise ZeroDivisionError("the user's score divided by zero")

    model = tiny_loaded.model
    before = ModelState.of(model)
    config = RunConfig(model="tiny", actions=("bad",), replicates=2, horizon=4)
    store = RunStore.open(tmp_path / "run", config.as_dict())
    with pytest.raises(PressFailed, match="the press raised ZeroDivisionError"):
        run_units(config, [DOC], LMPairFactory(tiny_loaded, presses={
            "bad": BreakingPress(0.5)}), store)
    assert before.changes() == ()


def test_the_state_names_every_kind_and_restores_it(tiny_llama):
    """Unit level: each change is found and named, and ``restore`` undoes all of them (values
    as they were, hooks and the forward gone, buffers' own tensors kept)."""
    model = copy.deepcopy(tiny_llama)  # the session's own model is never touched here
    attention = model.model.layers[0].self_attn
    attention.rotary_emb = model.model.rotary_emb  # as kvpress does: an alias, not a change
    inv_freq = model.model.rotary_emb.inv_freq
    kept = inv_freq.clone()
    state = ModelState.of(model)
    for change, (make, _, _) in CHANGES.items():
        if change != "config count":
            make(attention)
    model.train()
    handle = torch.nn.modules.module.register_module_forward_hook(leftover_hook)
    try:
        kinds = {c.kind for c in state.changes()}
        state.restore()
        assert kinds == {"config", "buffers", "module settings", "hooks",
                         "attention implementation", "forward methods"}
        assert state.changes() == ()
    finally:
        handle.remove()
    assert model.model.rotary_emb.inv_freq is inv_freq and torch.equal(inv_freq, kept)
    assert not model.training and not attention._forward_pre_hooks
    assert "forward" not in vars(attention.o_proj)
    assert model.config._attn_implementation == "sdpa"
    assert not torch.nn.modules.module._global_forward_hooks


# --- a scorer's scores in another shape, dtype or device ---------------------------------

#: What a scorer of one's own returns instead of ``keys.norm(dim=-1)`` ``[1, 2, n]``, and how
#: the refusal names it.
WRONG = {
    "per query head": (lambda s: s.repeat_interleave(2, dim=1),
                       "({b}, 4, {n}) torch.float32 on cpu"),
    "one entry short": (lambda s: s[..., 1:], "({b}, 2, {n1}) torch.float32 on cpu"),
    "no batch axis": (lambda s: s[0], "(2, {n}) torch.float32 on cpu"),
    "integers": (lambda s: s.long(), "({b}, 2, {n}) torch.int64 on cpu"),
    "a list": (lambda s: s.tolist(), "a list"),
    "another device": (lambda s: s.to("meta"), "({b}, 2, {n}) torch.float32 on meta"),
}


@dataclass
class WrongScorer(kvpress.ScorerPress):
    wrong: str = "per query head"

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return WRONG[self.wrong][0](keys.norm(dim=-1))


@pytest.mark.parametrize("wrong", WRONG)
@pytest.mark.parametrize("wrap", ["alone", "adakv"])
def test_scores_of_another_shape_are_one_line_naming_the_shape_expected(tiny_llama, wrong,
                                                                         wrap):
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    scorer = WrongScorer(compression_ratio=0.5, wrong=wrong)
    press = scorer if wrap == "alone" else kvpress.AdaKVPress(press=scorer)
    with pytest.raises(PressFailed) as info:
        press_prompt_cache(tiny_llama, ids, press, "mine", "d0")
    got = WRONG[wrong][1].format(b=1, n=40, n1=39)
    assert str(info.value) == (f"action 'mine' failed on document 'd0': WrongScorer.score() "
                               f"returned {got}; expected (batch, kv_heads, seq_len) = "
                               f"(1, 2, 40) floating point on cpu")
    assert "score" not in vars(scorer)  # the scorer is as it was


@pytest.mark.parametrize(("wrong", "got"), [("per query head", r"\(1, 4, (\d+)\) torch.float32"),
                                           ("integers", r"\(1, 2, (\d+)\) torch.int64")])
def test_a_decoding_scorer_of_another_shape_is_one_line(tiny_llama, wrong, got):
    """Replayed by kvdrift during generation: the same line, not ``topk``'s traceback."""
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(0))
    press = kvpress.DecodingPress(base_press=WrongScorer(wrong=wrong), compression_interval=2,
                                  target_size=10)
    pair = general_pair(tiny_llama, ids, press)
    with pytest.raises(PressFailed) as info:
        greedy_q(pair, 4)
    found = re.fullmatch(r"action 'mine' failed on document 'doc': WrongScorer\.score\(\) "
                         rf"returned {got} on cpu; expected \(batch, kv_heads, seq_len\) = "
                         r"\(1, 2, (\d+)\) floating point on cpu", str(info.value))
    assert found and found.group(1) == found.group(2), str(info.value)


@dataclass
class OwnKnormPress(kvpress.ScorerPress):
    """kvpress's KnormPress written as one's own (its scores are checked)."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return -keys.norm(dim=-1)


def test_right_scores_of_ones_own_pass_unchanged(tiny_llama):
    """The check changes nothing where the scores are right: the same cache as unchecked."""
    ids = torch.randint(3, 128, (1, 40), generator=torch.Generator().manual_seed(1))
    checked = press_prompt_cache(tiny_llama, ids, OwnKnormPress(compression_ratio=0.5), "q",
                                 "d0")
    plain = press_prompt_cache(tiny_llama, ids, kvpress.KnormPress(compression_ratio=0.5),
                               "k", "d0")
    for a, b in zip(checked.cache.keys, plain.cache.keys, strict=True):
        assert torch.equal(a, b)


def test_from_python_the_model_handed_over_comes_back_as_it_was(tiny_model_dir, tmp_path):
    """``kvdrift.measure`` on a model object: the refusal is raised, and the object the caller
    holds is the model it handed over (its config, buffers and hooks), ready for the next call."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import kvdrift

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    from kvdrift.data import write_jsonl

    mine = kvdrift.Model(model, AutoTokenizer.from_pretrained(tiny_model_dir), "mine")
    docs = write_jsonl([DOC], tmp_path / "docs.jsonl")
    before = ModelState.of(model.eval())
    for change in ("config field", "rotary buffer", "forward hook"):
        with pytest.raises(PressFailed, match=rf"^action 'bad' \(ChangingPress\) changed the "
                                              rf"model's {CHANGES[change][1]} on document"):
            kvdrift.measure(mine, {"bad": at_prefill(change)}, docs=docs, replicates=2,
                            horizon=4, bootstrap=0)
        assert before.changes() == ()
    quiet = kvdrift.measure(mine, {"quiet": QuietPress(0.5)}, docs=docs, replicates=2,
                            horizon=4, bootstrap=0)
    assert len(quiet.records.replicates) == 2


LEAVING_PRESSES = '''
import contextlib
from dataclasses import dataclass

from kvpress import KnormPress


def count_calls(module, args):
    """A forward pre-hook the press means to keep for itself."""


@dataclass
class LeavingPress(KnormPress):
    """kvpress's KnormPress, with a hook of its own registered in its context and never removed."""

    @contextlib.contextmanager
    def __call__(self, model):
        model.model.norm.register_forward_pre_hook(count_calls)
        with super().__call__(model):
            yield


PRESSES = {"leaving": LeavingPress(compression_ratio=0.5),
           "quiet": KnormPress(compression_ratio=0.5)}
'''


def test_from_the_command_line_a_hook_left_by_a_presses_file_stops_the_run(tiny_model_dir,
                                                                            tmp_path):
    """The press's context registers a hook and exits without removing it: rc 2, one line
    naming the action, the hook and where; the units before it are kept."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from kvdrift.cli import app
    from kvdrift.data import write_jsonl
    from tests.test_cli_faults import run_args

    presses = tmp_path / "leaving_presses.py"
    presses.write_text(LEAVING_PRESSES)
    docs = write_jsonl([DOC], tmp_path / "docs.jsonl")
    out = tmp_path / "run"
    args = run_args(tiny_model_dir, docs, out)
    args[args.index("--actions") + 1] = "full,quiet,leaving,snapkv-half"
    result = CliRunner().invoke(app, [*args, "--presses", str(presses)])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line == ("error: action 'leaving' (LeavingPress) changed the model's hooks on "
                    "document 'd0': a forward pre-hook left on model.norm (count_calls); a "
                    "press must leave the model as it found it (kvdrift has put it back); the "
                    "unit is not stored and the run stops here (finished units are kept)"), line
    stored = pq.read_table(out / "replicates").column("action").unique().to_pylist()
    assert sorted(stored) == ["full", "quiet"]
