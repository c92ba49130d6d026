"""The named spec of a decoding press over AdaKV, ``decoding-adakv-<scorer>:interval=I,target=T``
(lm/actions/presses.py's ``HeadAdaptiveDecoding``): it builds the press a user would build by
hand, ``DecodingPress(base_press=AdaKVPress(press=<scorer>, alpha_safeguard=A), ...)``, and is
measured by the same rule (lm/engine/decoding_adakv.py), token for token and logprob for
logprob; a bad field or scorer is refused naming it."""

from __future__ import annotations

import kvpress
import pytest
import torch

from kvdrift.lm.actions.spec import actions_help, parse_action
from kvdrift.lm.engine.decoding_adakv import HeadAdaptiveRule
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.factory import DriverSide, check_actions_fit
from kvdrift.lm.grammar.names import check_action_names, split_prefix
from tests.test_lm_press_path import EOS, general_pair
from tests.test_lm_presses import prompt

N = 60  # prompt tokens
LONG = 256  # generated positions: compressions after 64, 128, 192 and 256
SIDE = DriverSide(name="m", tokenizer=None, build=lambda: None, context_window=None, layers=2)

def adakv_knorm(**adakv) -> kvpress.DecodingPress:
    return kvpress.DecodingPress(base_press=kvpress.AdaKVPress(press=kvpress.KnormPress(), **adakv),
                                 compression_interval=64, target_size=48,
                                 hidden_states_buffer_size=16)


SPECS = {  # spec -> the press a user writes by hand
    "decoding-adakv-knorm:interval=64,target=48,buffer=16,alpha_safeguard=0.6": lambda:
        adakv_knorm(alpha_safeguard=0.6),
    "decoding-adakv-tova:interval=64,ratio=0.5": lambda:
        kvpress.CompressionRatioDecodingPress(
            base_press=kvpress.AdaKVPress(press=kvpress.TOVAPress()), compression_interval=64,
            target_compression_ratio=0.5),
}


def test_the_spec_builds_the_press_a_user_builds_by_hand():
    for spec, make in SPECS.items():
        action = parse_action(spec)
        assert action.decoding is not None and not action.stages
        assert action.make_press(N) == make(), spec
        assert repr(action.decoding.build(N)) == repr(make())
    assert parse_action("decoding-adakv-knorm:interval=64,target=48,buffer=16,"
                        "alpha_safeguard=0.6").kvpress_call() == (
        "DecodingPress(base_press=AdaKVPress(press=KnormPress(), alpha_safeguard=0.6), "
        "hidden_states_buffer_size=16, compression_interval=64, target_size=48)")
    default = parse_action("decoding-adakv-snapkv:interval=64,target=48,window_size=4")
    assert default.make_press(N) == kvpress.DecodingPress(
        base_press=kvpress.AdaKVPress(press=kvpress.SnapKVPress(window_size=4)),
        compression_interval=64, target_size=48)
    assert default.decoding.field("alpha_safeguard") == 0.2  # AdaKVPress's own default
    # the longest family prefix wins; plain decoding- is unchanged
    assert split_prefix("decoding-adakv-knorm") == ("decoding-adakv", "knorm")
    assert split_prefix("Decoding-knorm") == ("decoding", "knorm")
    assert parse_action("decoding-knorm:interval=64,target=48").make_press(N) == \
        kvpress.DecodingPress(base_press=kvpress.KnormPress(), compression_interval=64,
                              target_size=48)
    assert "decoding-adakv-<scorer>:interval=I,target=T" in actions_help()


def q_logprobs(pair: LMKernelPair, steps: int) -> tuple[list[int], torch.Tensor]:
    """Q's greedy tokens (EOS never chosen) and its logprobs at every step."""
    state, tokens, rows = pair.start("q", 1), [], []
    for _ in range(steps):
        lp = pair.logprobs(state)[0]
        rows.append(lp)
        lp = lp.clone()
        lp[EOS] = -torch.inf
        tokens.append(int(lp.argmax()))
        state = pair.advance(state, torch.tensor([tokens[-1]]))
    return tokens, torch.stack(rows)


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_the_spec_and_the_hand_built_press_agree_token_for_token(tiny_llama, spec):
    ids = prompt(N)
    named = LMKernelPair(tiny_llama, ids, spec)
    rule = named.decoding_rule
    assert isinstance(rule, HeadAdaptiveRule) and rule.spec
    assert int(rule.compresses(torch.arange(1, LONG + 1)).sum()) >= 3
    tokens, logprobs = q_logprobs(named, LONG)
    by_hand, want = q_logprobs(general_pair(tiny_llama, ids, SPECS[spec]()), LONG)
    assert tokens == by_hand
    assert torch.equal(logprobs, want)  # one rule, one prompt cache: bit for bit
    plain = q_logprobs(LMKernelPair(tiny_llama, ids, "full"), LONG)[0]
    assert tokens != plain  # the press changed Q's tokens
    if "alpha_safeguard=0.6" in spec:  # the field reaches AdaKV: its default (0.2) differs
        assert q_logprobs(general_pair(tiny_llama, ids, adakv_knorm()), LONG)[0] != tokens


@pytest.mark.parametrize("spec, says", [
    ("decoding-adakv-knorm:interval=64,target=48,alpha_safeguard=1.5",
     r"^action '.*': decoding-adakv-KnormPress: alpha_safeguard must be a number within "
     r"\[0, 1\]; got 1.5$"),
    ("decoding-adakv-knorm:interval=64,target=48,window=3",
     r"decoding-adakv-KnormPress field must be one of interval, target, buffer, "
     r"alpha_safeguard; got 'window'$"),
    ("decoding-adakv-knorm:interval=64,target=0", r"target must be an integer >= 1; got 0$"),
    ("decoding-adakv-knorm:interval=64", r"give target=T"),
    ("decoding-adakv-knorm:interval=64,budget=8", r"not budget=$"),
    ("decoding-adakv-nope:interval=64,target=48", r"press must be one of .*; got 'nope'$"),
    ("decoding-adakv-observed_attention:interval=64,target=48",
     r"ObservedAttentionPress needs attention weights"),
])
def test_a_bad_field_or_scorer_is_refused_naming_it(spec, says):
    with pytest.raises(ValueError, match=says) as info:
        parse_action(spec)
    assert "\n" not in str(info.value)


def test_an_unknown_scorer_is_refused_before_kvpress_as_the_parser_refuses_it():
    with pytest.raises(ValueError) as early:
        check_action_names("decoding-adakv-nope:interval=64,target=48")
    with pytest.raises(ValueError) as full:
        parse_action("decoding-adakv-nope:interval=64,target=48")
    assert str(early.value) == str(full.value)
    check_action_names("decoding-adakv-knorm:interval=64,target=48")  # a known one passes


def test_the_press_s_own_rules_are_checked_at_start_in_the_spec_s_fields():
    with pytest.raises(ValueError, match=r"^action 'decoding-adakv-snapkv:interval=4,target=40'"
                                         r": its DecodingPress compresses every 4 generated "
                                         r"tokens .* window_size=64; raise interval= to at "
                                         r"least 65"):
        check_actions_fit(["decoding-adakv-snapkv:interval=4,target=40"], SIDE, horizon=256)
    with pytest.raises(ValueError, match=r"compresses first after interval=300 generated "
                                         r"tokens, beyond the horizon H = 256"):
        check_actions_fit(["decoding-adakv-knorm:interval=300,target=40"], SIDE, horizon=256)
    check_actions_fit(["decoding-adakv-knorm:interval=64,target=40"], SIDE, horizon=256,
                      estimator="swrb")  # its rows go back: SWRB runs (unlike CAMPress)


def test_after_a_head_adaptive_prefill_the_chain_is_its_press_object_and_kvpress_s(tiny_llama):
    """AdaKV under a DecodingPress hides in place, never reordering the cache, so it follows
    a head-adaptive prefill (a press that cuts is refused there): the chain builds kvpress's
    PrefillDecodingPress and equals it, and kvpress's own generate, over four compressions."""
    from tests.test_lm_press_path import generate_in

    ids = prompt(N)
    spec = "adakv-knorm:ratio=0.5+decoding-adakv-knorm:interval=16,target=20"
    press = parse_action(spec).make_press(N)
    assert press == kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.AdaKVPress(press=kvpress.KnormPress(compression_ratio=0.5)),
        decoding_press=kvpress.DecodingPress(base_press=kvpress.AdaKVPress(
            press=kvpress.KnormPress()), compression_interval=16, target_size=20))
    tokens, logprobs = q_logprobs(LMKernelPair(tiny_llama, ids, spec), 64)
    by_hand, want = q_logprobs(general_pair(tiny_llama, ids, press), 64)
    assert tokens == by_hand and torch.equal(logprobs, want)
    assert tokens == generate_in(tiny_llama, ids, parse_action(spec).make_press(N), 64)
    for cuts in ("decoding-knorm:interval=16,target=20", "cam-knorm:interval=16,target=20"):
        with pytest.raises(ValueError, match=r"reorders and shortens that cache, .*"
                                             r"or decoding-adakv-<scorer>, which hides in place"):
            parse_action(f"adakv-knorm:ratio=0.5+{cuts}")
