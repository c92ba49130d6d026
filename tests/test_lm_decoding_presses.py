"""Every decoding-time press of kvpress, measured exactly or refused in its own terms (issue 49,
items 1 and 3).

Each replayed press is checked against kvpress's own ``generate`` inside the same press, batch
of one, greedy, over 256 generated positions spanning at least three compressions; a named spec
and the same press given as an object agree token for token. Each press kvdrift does not replay
is refused in one line that says what the press does. A press's own rules that cannot hold
(SnapKV's window above what a compression holds, a scorer decoding cannot feed, no compression
within the horizon) refuse the command before anything is written.
"""

from __future__ import annotations

import kvpress
import pytest
import torch
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data.document import Document
from kvdrift.data.loaders import write_jsonl
from kvdrift.lm.actions.spec import actions_help, parse_action
from kvdrift.lm.engine.decoding import NEVER, DecodingRule
from kvdrift.lm.engine.decoding_presses import decoding_rule
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.factory import DriverSide, check_actions_fit
from tests.test_lm_press_path import general_pair, generate_in, greedy_q
from tests.test_lm_presses import prompt

LONG = 256  # generated positions of the equality tests
N = 60  # prompt tokens


def crdp(interval: int, kept: float, scorer=None) -> kvpress.CompressionRatioDecodingPress:
    return kvpress.CompressionRatioDecodingPress(
        base_press=scorer or kvpress.KnormPress(), compression_interval=interval,
        target_compression_ratio=1 - kept)


def dms(threshold: float, window: int, scorer=None) -> kvpress.DMSPress:
    return kvpress.DMSPress(press=scorer or kvpress.KnormPress(), threshold=threshold,
                            sliding_window_size=window, decoding=True)


def compressions(rule: DecodingRule, steps: int) -> int:
    return int(rule.compresses(torch.arange(1, steps + 1)).sum())


# --- replayed exactly ---------------------------------------------------------------------

OBJECTS = {
    "decoding-knorm": lambda: kvpress.DecodingPress(
        base_press=kvpress.KnormPress(), compression_interval=64, target_size=48),
    "decoding-snapkv": lambda: kvpress.DecodingPress(
        base_press=kvpress.SnapKVPress(window_size=4), compression_interval=50, target_size=70,
        hidden_states_buffer_size=16),
    "ratio-knorm": lambda: crdp(64, 0.5),
    "ratio-snapkv-every-step-then-interval": lambda: crdp(
        40, 0.3, kvpress.SnapKVPress(window_size=2)),
    "ratio-tova": lambda: crdp(32, 0.25, kvpress.TOVAPress()),
    "prefill-snapkv-then-ratio": lambda: kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.SnapKVPress(compression_ratio=0.5, window_size=8),
        decoding_press=crdp(48, 0.6)),
    "prefill-knorm-then-target": lambda: kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.KnormPress(compression_ratio=0.3),
        decoding_press=kvpress.DecodingPress(base_press=kvpress.StreamingLLMPress(),
                                             compression_interval=80, target_size=40)),
}


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_a_decoding_press_object_equals_generate_inside_it(tiny_llama, name):
    ids = prompt(N)
    pair = general_pair(tiny_llama, ids, OBJECTS[name]())
    assert compressions(pair._rule, LONG) >= 3
    got = greedy_q(pair, LONG)
    assert got == generate_in(tiny_llama, ids, OBJECTS[name](), LONG)
    assert got != generate_in(tiny_llama, ids, None, LONG)  # the press changed Q's tokens


@pytest.mark.parametrize("threshold, window", [(-1.2, 16), (-0.8, 100)])
def test_dms_with_decoding_equals_generate_inside_it(tiny_llama, threshold, window):
    """DMSPress(decoding=True): entries leaving the sliding window are hidden per KV head where
    their score is below the threshold, prompt and generated alike (window 100 > 60 prompt
    tokens: every hidden entry is hidden during decoding)."""
    ids = prompt(N)
    pair = general_pair(tiny_llama, ids, dms(threshold, window))
    state, got = pair.start("q", 1), []
    for _ in range(LONG):
        lp = pair.logprobs(state)[0].clone()
        lp[2] = -torch.inf
        got.append(int(lp.argmax()))
        state = pair.advance(state, torch.tensor([got[-1]]))
    assert got == generate_in(tiny_llama, ids, dms(threshold, window), LONG)
    assert got != generate_in(tiny_llama, ids, None, LONG)
    ev = state.evictions
    hidden_generated = sum(int((o != NEVER).sum()) for o in ev.own)
    assert hidden_generated > 0
    # an entry is hidden exactly at the step it leaves the window: n + L - 1 - W = index
    for o in ev.own:
        steps = o[0]  # [kv, G]
        for head, slot in torch.nonzero(steps != NEVER).tolist():
            assert int(steps[head, slot]) == slot + window + 1


def check_forks_replay_own_hidden_entries(pair: LMKernelPair) -> tuple[torch.Tensor, ...]:
    """A row run alone and the same row in a batch beside another history agree at every
    step; the batch's row, selected and truncated to 15, 9 and 3 tokens, gives the logprobs
    it had there and, fed the same tokens again, the same last logprobs. Returns (the lone
    row's last logprobs, the batch's)."""
    xs, others = prompt(20, seed=11)[0], prompt(20, seed=12)[0]
    alone, batch, logprobs = pair.start("q", 1), pair.start("q", 2), []
    for t in range(20):
        logprobs.append(pair.logprobs(alone)[0])
        alone = pair.advance(alone, xs[t:t + 1])
        batch = pair.advance(batch, torch.stack([xs[t], others[t]]))
        assert torch.allclose(pair.logprobs(alone)[0], pair.logprobs(batch)[0], atol=1e-5)
    final, together = pair.logprobs(alone), pair.logprobs(batch)
    for keep in (15, 9, 3):
        cut = pair.truncate(pair.select(batch, torch.tensor([0])), torch.tensor([keep]))
        assert torch.allclose(pair.logprobs(cut)[0], logprobs[keep], atol=1e-5), keep
        for t in range(keep, 20):
            cut = pair.advance(cut, xs[t:t + 1])
        assert torch.allclose(pair.logprobs(cut), final, atol=1e-5), keep
    return final, together


def test_dms_rows_forked_and_truncated_replay_their_own_hidden_entries(tiny_llama):
    check_forks_replay_own_hidden_entries(general_pair(tiny_llama, prompt(N), dms(-1.2, 6)))


def adakv(scorer=None, interval: int = 64, target: int = 48) -> kvpress.DecodingPress:
    return kvpress.DecodingPress(base_press=kvpress.AdaKVPress(scorer or kvpress.KnormPress()),
                                 compression_interval=interval, target_size=target,
                                 hidden_states_buffer_size=16)


HEAD_ADAPTIVE = {
    "decoding-adakv-knorm": lambda: adakv(),
    "ratio-adakv-tova": lambda: kvpress.CompressionRatioDecodingPress(
        base_press=kvpress.AdaKVPress(kvpress.TOVAPress()), compression_interval=64,
        target_compression_ratio=0.5),
    "prefill-dms-then-adakv-knorm": lambda: kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.DMSPress(press=kvpress.KnormPress(), threshold=-1.0),
        decoding_press=adakv()),
}


def greedy_q_state(pair: LMKernelPair, steps: int):
    state, got = pair.start("q", 1), []
    for _ in range(steps):
        lp = pair.logprobs(state)[0].clone()
        lp[2] = -torch.inf
        got.append(int(lp.argmax()))
        state = pair.advance(state, torch.tensor([got[-1]]))
    return got, state


@pytest.mark.parametrize("name", sorted(HEAD_ADAPTIVE))
def test_a_decoding_press_over_adakv_equals_generate_inside_it(tiny_llama, name):
    """AdaKV hides entries per KV head at each compression, each later one scoring the fake
    keys kvpress wrote over the hidden entries; under KnormPress, which scores each head on
    its own (TOVA scores all heads alike), the KV heads hide different counts."""
    ids = prompt(N)
    pair = general_pair(tiny_llama, ids, HEAD_ADAPTIVE[name]())
    assert compressions(pair._rule, LONG) >= 3
    got, state = greedy_q_state(pair, LONG)
    assert got == generate_in(tiny_llama, ids, HEAD_ADAPTIVE[name](), LONG)
    assert got != generate_in(tiny_llama, ids, None, LONG)
    hidden = [torch.cat([p[0], o[0]], dim=1) != NEVER
              for p, o in zip(state.evictions.prompt, state.evictions.own, strict=True)]
    per_head = torch.stack([h.sum(-1) for h in hidden])  # [layers, kv]
    assert int(per_head.sum()) > 0
    assert "knorm" not in name or bool((per_head[:, 0] != per_head[:, 1]).any())
    # hidden only at the compressions' steps, never undone
    steps = torch.cat([torch.cat([p[0], o[0]], dim=1).flatten()
                       for p, o in zip(state.evictions.prompt, state.evictions.own,
                                       strict=True)])
    steps = set(steps[steps != NEVER].tolist())
    assert steps <= {s for s in range(1, LONG + 1) if bool(pair._rule.compresses(
        torch.tensor([s]))[0])}


def test_adakv_rows_forked_and_truncated_replay_their_own_hidden_entries(tiny_llama):
    final, batch = check_forks_replay_own_hidden_entries(
        general_pair(tiny_llama, prompt(N), adakv(interval=4, target=40)))
    assert not torch.allclose(batch[1], final[0], atol=1e-2)  # own histories


class LargestKeyPress(kvpress.ScorerPress):
    """Keeps the keys of largest norm: a fake key (norm ~1e4) is always kept."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys.norm(dim=-1)


def test_an_adakv_press_showing_a_hidden_entry_again_fails_in_one_line(tiny_llama):
    """kvpress's generate runs, attending to the shown entries through their fake keys; kvdrift
    does not store those keys, so the unit fails at that compression."""
    ids = prompt(N)
    assert len(generate_in(tiny_llama, ids, adakv(LargestKeyPress(), 8, 40), 24)) == 24
    pair = general_pair(tiny_llama, ids, adakv(LargestKeyPress(), 8, 40))
    with pytest.raises(ValueError, match=r"its DecodingPress: its AdaKVPress shows again, after "
                                         r"generated token 16, \d+ entries it hid before; "
                                         r"kvpress then attends to each through the fake key") \
            as info:
        greedy_q(pair, 24)
    assert "\n" not in str(info.value)


def test_where_kvpress_finds_no_fake_key_the_unit_fails_at_the_same_step(tiny_llama):
    """kvpress searches a fake key at every step of a layer that hides entries (here from the
    prefill on) and its generate raises when the search does not end: after token 43 here."""
    ids = prompt(N)

    def make():
        return kvpress.PrefillDecodingPress(
            prefilling_press=kvpress.AdaKVPress(kvpress.KnormPress(0.5)), decoding_press=adakv())

    assert len(generate_in(tiny_llama, ids, make(), 43)) == 43
    with pytest.raises(ValueError, match="Could not find fake keys"):
        generate_in(tiny_llama, ids, make(), 44)
    pair = general_pair(tiny_llama, ids, make())
    with pytest.raises(ValueError, match=r"its DecodingPress: kvpress hides entries at each step "
                                         r"by a fake key, and finds none after generated token "
                                         r"43 \(ValueError: Could not find fake keys"):
        greedy_q(pair, 44)


def test_the_ratio_target_follows_the_tokens_seen():
    """kvpress's own target at each step: max(1, int((n + L) (1 - c))), compressing at every
    step while it is at most 1, then every ``interval`` steps from there."""
    rule = DecodingRule(crdp(10, 0.25), "r").for_prompt(3)
    assert [rule.target_at(n) for n in (1, 4, 5, 97)] == [1, 1, 2, 25]
    assert rule.every_step == 4  # (3 + 4) x 0.25 < 2 <= (3 + 5) x 0.25
    assert torch.nonzero(rule.compresses(torch.arange(1, 40))).flatten().add(1).tolist() == [
        1, 2, 3, 4, 14, 24, 34]
    assert [rule.step_of(j) for j in range(7)] == [0, 1, 2, 3, 4, 14, 24]
    assert [rule.window_at(n) for n in (3, 14)] == [1, 10]
    fixed = DecodingRule(kvpress.DecodingPress(base_press=kvpress.KnormPress(),
                                               compression_interval=7, target_size=1), "f")
    assert fixed.compresses(torch.arange(1, 5)).tolist() == [True] * 4  # target <= 1


@pytest.mark.parametrize("spec", [
    "decoding-knorm:interval=64,ratio=0.5",
    "decoding-snapkv:interval=40,ratio=0.3,window_size=2",
    "snapkv:ratio=0.5,window_size=8+decoding-knorm:interval=48,ratio=0.6",
    "decoding-expected_attention:interval=64,target=50",
])
def test_a_named_decoding_spec_equals_generate_over_256_positions(tiny_llama, spec):
    ids = prompt(N)
    pair = LMKernelPair(tiny_llama, ids, spec)
    assert compressions(pair._rule, LONG) >= 3
    want = generate_in(tiny_llama, ids, parse_action(spec).make_press(N), LONG)
    assert greedy_q(pair, LONG) == want


@pytest.mark.parametrize("spec, name", [
    ("decoding-knorm:interval=64,ratio=0.5", "ratio-knorm"),
    ("decoding-snapkv:interval=40,ratio=0.3,window_size=2",
     "ratio-snapkv-every-step-then-interval"),
    ("snapkv:ratio=0.5,window_size=8+decoding-knorm:interval=48,ratio=0.6",
     "prefill-snapkv-then-ratio"),
    ("decoding-knorm:interval=64,target=48", "decoding-knorm"),
])
def test_a_named_spec_and_its_press_object_agree_token_for_token(tiny_llama, spec, name):
    ids = prompt(N)
    assert parse_action(spec).kvpress_call().startswith(
        type(OBJECTS[name]()).__name__)
    named = greedy_q(LMKernelPair(tiny_llama, ids, spec), LONG)
    assert named == greedy_q(general_pair(tiny_llama, ids, OBJECTS[name]()), LONG)


def test_the_ratio_spec_builds_kvpress_s_press():
    action = parse_action("decoding-knorm:interval=32,ratio=0.25,buffer=8")
    assert action.kvpress_call() == (
        "CompressionRatioDecodingPress(base_press=KnormPress(), hidden_states_buffer_size=8, "
        "compression_interval=32, target_compression_ratio=0.75)")
    for bad, says in [("decoding-knorm:interval=4,ratio=0.5,target=8", "not ratio="),
                      ("decoding-knorm:interval=4,budget=8", "not budget="),
                      ("decoding-knorm:interval=4,ratio=0", r"ratio .* must be")]:
        with pytest.raises(ValueError, match=says):
            parse_action(bad)


# --- refused, in the press's own terms -------------------------------------------------------

REFUSED = {
    "dms-as-decoding-press": (lambda: kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.KnormPress(0.5), decoding_press=dms(-1.2, 16)),
        r"^action 'p': its decoding_press DMSPress scores the prompt at prefill itself"),
    "head-adaptive-prefill": (lambda: kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.AdaKVPress(kvpress.KnormPress(0.5)),
        decoding_press=kvpress.DecodingPress(base_press=kvpress.KnormPress())),
        r"^action 'p': its prefilling_press AdaKVPress hides entries per KV head by their "
        r"positions in the cache, and its DecodingPress's first compression reorders"),
    "own-hook": (lambda: OwnHookPress(base_press=kvpress.KnormPress()),
                 r"^action 'p': OwnHookPress overrides DecodingPress's forward_hook, so it "
                 r"compresses during decoding in its own way"),
}


class OwnHookPress(kvpress.DecodingPress):
    def forward_hook(self, module, input, kwargs, output):
        return output


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_decoding_press_kvdrift_does_not_replay_says_why_in_its_own_terms(name):
    make, says = REFUSED[name]
    with pytest.raises(ValueError, match=says) as info:
        decoding_rule(make(), "p")
    assert "\n" not in str(info.value) and "kvdrift replays" not in str(info.value)
    assert decoding_rule(kvpress.SnapKVPress(0.5), "s") is None  # compresses at prefill only


@pytest.mark.parametrize("prefill", [kvpress.AdaKVPress, kvpress.CriticalAdaKVPress])
def test_kvpress_itself_fails_on_a_head_adaptive_prefill_then_decoding(tiny_llama, prefill):
    """Why the head-adaptive prefill is refused: kvpress's own generate (0.5.5) hides positions
    the compressed cache no longer has."""
    make, says = REFUSED["head-adaptive-prefill"]
    press = make()
    press.prefilling_press = prefill(kvpress.KnormPress(0.5))
    press.decoding_press.compression_interval, press.decoding_press.target_size = 4, 20
    with pytest.raises(ValueError, match=says.replace("AdaKVPress", prefill.__name__)):
        decoding_rule(press, "p")
    with pytest.raises(IndexError):
        generate_in(tiny_llama, prompt(N), press, 12)


def test_kvdrift_actions_lists_the_ratio_spec_and_cam_as_measured():
    text = actions_help()
    line = next(row for row in text.splitlines()
                if row.strip().startswith("CompressionRatioDecodingPress "))
    assert "shared prefill: decoding-<scorer>:interval=I,ratio=R" in line
    cam = next(row for row in text.splitlines() if row.strip().startswith("CAMPress "))
    assert "shared prefill: cam-<scorer>:interval=I,target=T" in cam
    assert "CAMPress:" not in text.split("Not offered:")[1]


# --- a press's rules, checked before anything is written ---------------------------------------

SIDE = DriverSide(name="m", tokenizer=None, build=lambda: None, context_window=None, layers=2)


@pytest.mark.parametrize("spec, says", [
    ("decoding-snapkv:interval=32,target=40",
     r"^action 'decoding-snapkv:interval=32,target=40': its DecodingPress compresses every 32 "
     r"generated tokens from the hidden states of the last min\(interval, buffer \+ 1\) = 32 "
     r"steps, but its SnapKVPress looks at the last window_size=64; raise interval= to at "
     r"least 65, or lower window_size= below 32$"),
    ("decoding-snapkv:interval=128,target=40,buffer=8",
     r"raise buffer= to at least 64, or lower window_size= below 9$"),
    ("decoding-knorm:interval=512,target=40",
     r"^action 'decoding-knorm:interval=512,target=40': its DecodingPress compresses first "
     r"after interval=512 generated tokens, beyond the horizon H = 256, so Q would never be "
     r"compressed; lower interval= to at most 256 or raise the horizon$"),
    ("decoding-leverage:interval=8,target=40",
     r"^action 'decoding-leverage:interval=8,target=40': its DecodingPress scores with "
     r"LeverageScorePress, which scores only a prefill"),
])
def test_a_spec_whose_press_rules_cannot_hold_is_refused_at_start(spec, says):
    with pytest.raises(ValueError, match=says):
        check_actions_fit([spec], SIDE, horizon=256)
    check_actions_fit(["decoding-knorm:interval=256,target=40"], SIDE, horizon=256)


@pytest.mark.parametrize("press, says", [
    (kvpress.DecodingPress(base_press=kvpress.SnapKVPress(), compression_interval=32,
                           target_size=40),
     r"^action 'mine': its DecodingPress compresses every 32 generated tokens from the hidden "
     r"states of the last min\(compression_interval, hidden_states_buffer_size \+ 1\) = 32 "
     r"steps, .* raise compression_interval= to at least 65"),
    (kvpress.DecodingPress(base_press=kvpress.ObservedAttentionPress(), compression_interval=8,
                           target_size=40),
     r"^action 'mine': its DecodingPress scores with ObservedAttentionPress, which reads "
     r"attention weights that kvpress's decoding steps do not return; score with another"),
    (kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.KnormPress(0.5),
        decoding_press=kvpress.DecodingPress(base_press=kvpress.LeverageScorePress(),
                                             compression_interval=8, target_size=40)),
     r"^action 'mine': its DecodingPress scores with LeverageScorePress, which scores only a "
     r"prefill"),
    (adakv(kvpress.SnapKVPress(window_size=64), 32, 40),
     r"^action 'mine': its DecodingPress compresses every 32 generated tokens from the hidden "
     r"states of the last min\(compression_interval, hidden_states_buffer_size \+ 1\) = 17 "
     r"steps, but its SnapKVPress looks at the last window_size=64"),
    (adakv(kvpress.ObservedAttentionPress(), 8, 40),
     r"^action 'mine': its DecodingPress scores with ObservedAttentionPress, which reads "
     r"attention weights"),
    (crdp(300, 0.5), r"^action 'mine': its CompressionRatioDecodingPress compresses first after "
                     r"compression_interval=300 generated tokens, beyond the horizon H = 256"),
    (kvpress.CAMPress(base_press=kvpress.SnapKVPress(), compression_interval=32,
                      target_size=40),
     r"^action 'mine': its CAMPress compresses every 32 generated tokens from the hidden "
     r"states of the last min\(compression_interval, hidden_states_buffer_size \+ 1\) = 32 "
     r"steps, but its SnapKVPress looks at the last window_size=64"),
    (dms(0.0, 8, kvpress.SnapKVPress()),
     r"^action 'mine': its DMSPress scores each generated token alone \(one hidden state\), "
     r"but its SnapKVPress looks at the last window_size=64"),
    (dms(0.0, 8, kvpress.ObservedAttentionPress()),
     r"^action 'mine': its DMSPress scores with ObservedAttentionPress"),
])
def test_a_press_object_whose_rules_cannot_hold_is_refused_at_start(press, says):
    with pytest.raises(ValueError, match=says):
        check_actions_fit(["mine"], SIDE, {"mine": press}, 256, [("d0", 90), ("d1", 60)])


@pytest.mark.parametrize("press, says", [
    (kvpress.SnapKVPress(compression_ratio=0.5),
     r"^action 'mine': its SnapKVPress scores the prompt from its last window_size=64 tokens, "
     r"but document 'd1' has 60 prompt tokens \(kvpress asserts more than window_size\); "
     r"lower window_size= below 60$"),
    (kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.ComposedPress([kvpress.KnormPress(0.2),
                                                kvpress.ExpectedAttentionPress(0.5, n_sink=60)]),
        decoding_press=kvpress.DecodingPress(base_press=kvpress.KnormPress(),
                                             compression_interval=8, target_size=40)),
     r"^action 'mine': its ExpectedAttentionPress keeps n_sink=60 first tokens, but document "
     r"'d1' has 60 prompt tokens"),
])
def test_a_press_object_s_prefill_window_above_the_shortest_prompt_is_refused(press, says):
    with pytest.raises(ValueError, match=says):
        check_actions_fit(["mine"], SIDE, {"mine": press}, 256, [("d0", 90), ("d1", 60)])
    check_actions_fit(["mine"], SIDE, {"mine": press}, 256, [("d0", 90)])  # fits them all
    # a decoding scorer's window is checked against its interval, not the prompt
    decoding = kvpress.DecodingPress(base_press=kvpress.SnapKVPress(window_size=64),
                                     compression_interval=65, target_size=40)
    check_actions_fit(["mine"], SIDE, {"mine": decoding}, 256, [("d1", 60)])
    decoding.base_press = kvpress.AdaKVPress(decoding.base_press)  # the scorer AdaKV wraps too
    check_actions_fit(["mine"], SIDE, {"mine": decoding}, 256, [("d1", 60)])


def test_a_refused_command_writes_nothing_and_the_corrected_one_runs(tiny_model_dir, tmp_path):
    """The issue's case: SnapKV's window above the interval was refused only when the unit
    ran, after run.json, and the folder then refused the corrected command."""
    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id="d0", prompt="The cat sat on the mat. " * 12)], docs)
    out = tmp_path / "run"

    def run(spec: str):
        return CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir), "--docs",
                                        str(docs), "--actions", spec, "--replicates", "2",
                                        "--horizon", "8", "--out", str(out)])

    bad = run("decoding-snapkv:interval=4,target=40")
    assert bad.exit_code == 2, bad.output
    assert ("action 'decoding-snapkv:interval=4,target=40': its DecodingPress compresses every "
            "4 generated tokens") in bad.output
    assert "Traceback" not in bad.output and not out.exists()
    good = run("decoding-snapkv:interval=4,target=40,window_size=2")
    assert good.exit_code == 0, good.output
    assert (out / "run.json").exists()


# --- SmolLM2, one test per press class -------------------------------------------------------

SMOL = {
    "DecodingPress": "decoding-knorm:interval=64,target=96",
    "CompressionRatioDecodingPress": "decoding-knorm:interval=64,ratio=0.5",
    "PrefillDecodingPress": "snapkv:ratio=0.5+decoding-snapkv:interval=64,ratio=0.5,"
                            "window_size=8,buffer=16",
}


@pytest.mark.slow
@pytest.mark.parametrize("press_class", sorted(SMOL))
def test_decoding_presses_on_smollm2_equal_generate_over_256_positions(embedded_smollm2,
                                                                      press_class):
    from kvdrift.lm.loading.model import encode_prompt

    loaded = embedded_smollm2
    text = ("Rivers carve valleys over millennia; glaciers widen them, and the sea floods "
            "their mouths when the ice melts. ") * 6 + "Explain how a fjord forms."
    ids = encode_prompt(loaded.tokenizer, text)
    spec = SMOL[press_class]
    assert parse_action(spec).kvpress_call().startswith(press_class)
    pair = LMKernelPair(loaded.model, ids, spec)
    assert compressions(pair._rule, LONG) >= 3
    want = generate_in(loaded.model, ids, parse_action(spec).make_press(ids.shape[1]), LONG)
    assert greedy_q(pair, LONG) == want


@pytest.mark.slow
def test_dms_with_decoding_on_smollm2_equals_generate_over_256_positions(embedded_smollm2):
    from kvdrift.lm.loading.model import encode_prompt

    loaded = embedded_smollm2
    text = ("Rivers carve valleys over millennia; glaciers widen them, and the sea floods "
            "their mouths when the ice melts. ") * 6 + "Explain how a fjord forms."
    ids = encode_prompt(loaded.tokenizer, text)

    def make():  # hides keys of norm above 20 (about a tenth of them) as they leave 64 steps
        return dms(-20.0, 64)

    got = greedy_q(general_pair(loaded.model, ids, make()), LONG)
    assert got == generate_in(loaded.model, ids, make(), LONG)
    # the press changed Q's tokens, already among the first 32 (from the 5th on, 244 of 256)
    assert got[:32] != generate_in(loaded.model, ids, None, 32)


@pytest.mark.slow
def test_a_decoding_press_over_adakv_on_smollm2_equals_generate(embedded_smollm2):
    """Head-adaptive hiding during decoding on a real model: 4 compressions over 256 positions,
    the later ones scoring the fake keys kvpress wrote over the entries hidden before."""
    from kvdrift.lm.loading.model import encode_prompt

    loaded = embedded_smollm2
    ids = encode_prompt(loaded.tokenizer, "Rivers carve valleys over millennia; glaciers widen "
                                          "them. Explain how a fjord forms.")
    pair = general_pair(loaded.model, ids, adakv(interval=64, target=24))
    assert compressions(pair._rule, 256) == 4
    got, state = greedy_q_state(pair, 256)
    assert got == generate_in(loaded.model, ids, adakv(interval=64, target=24), 256)
    ev = state.evictions
    assert sum(int((h != NEVER).sum()) for h in ev.prompt + ev.own) > 0


# --- a wrapper that cannot take a scorer reading attention weights -----------------------------

@pytest.mark.parametrize("spec, wrapper, why", [
    ("adakv-observed_attention:ratio=0.5", "AdaKVPress", "asserts the attention is not eager"),
    ("criticaladakv-observed_attention:ratio=0.5", "CriticalAdaKVPress",
     "asserts the attention is not eager"),
    ("block-observed_attention:ratio=0.5", "BlockPress", "asserts it is given no attention"),
    ("chunk-observed_attention:ratio=0.5", "ChunkPress", "asserts it is given no attention"),
    ("chunkkv-observed_attention:ratio=0.5", "ChunkKVPress", "asserts it is given no attention"),
])
def test_a_wrapper_refusing_attention_weights_is_refused_when_parsed(spec, wrapper, why):
    """These failed with kvpress's AssertionError inside the unit; now the spec is refused."""
    with pytest.raises(ValueError, match=rf"^action '{spec}': \S+: kvpress's {wrapper} .*{why}"
                                         rf".* \(ObservedAttentionPress\); score with another "
                                         rf"scorer, or drop the wrapper$"):
        parse_action(spec)
    parse_action(spec.replace("observed_attention", "knorm"))
    parse_action("criticalkv-observed_attention:ratio=0.5")  # CriticalKV passes them on


def test_a_press_object_wrapping_attention_weights_wrongly_is_refused_at_start(tiny_llama):
    press = kvpress.ChunkPress(kvpress.ObservedAttentionPress(0.5), chunk_length=16)
    with pytest.raises(ValueError, match=r"^action 'mine': its ChunkPress: kvpress's ChunkPress "
                                         r"scores chunk by chunk and asserts"):
        check_actions_fit(["mine"], SIDE, {"mine": press}, 256)
    with pytest.raises(Exception, match="does not support attentions"):  # what kvpress does
        general_pair(tiny_llama, prompt(N), press)


# --- through the runner: every Q row of a batch equals generate on that row alone ---------------

@pytest.mark.parametrize("action", ["decoding-knorm:interval=64,ratio=0.5", "dms", "adakv"])
def test_through_the_runner_every_q_row_equals_generate_alone(tiny_model_dir, action):
    """At temperature 0 the K = 3 rows of Y are stepped as one batch; each equals kvpress's
    generate inside the press on the prompt alone, over 256 positions."""
    from kvdrift.lm.factory import LMPairFactory
    from kvdrift.lm.loading.model import load_model
    from kvdrift.run.runner import RunConfig, unit_records

    loaded = load_model(str(tiny_model_dir), "cpu", "float32")
    presses = {"dms": dms(-1.2, 16), "adakv": adakv()}
    factory = LMPairFactory(loaded, presses=presses)
    doc = Document(id="d0", prompt=" ".join(f"word{i} is here, and the story goes on"
                                            for i in range(8)))
    config = RunConfig(model="tiny", actions=(action,), replicates=3, horizon=LONG,
                       temperature=0.0)
    steps, _ = unit_records(config, doc, action, factory)
    ids = factory.prompt_ids(doc)
    press = {"dms": dms(-1.2, 16), "adakv": adakv()}.get(action) or parse_action(
        action).make_press(ids.shape[-1])
    want = generate_in(loaded.model, ids, press, LONG, eos_allowed=True)
    assert len(want) == LONG
    rows = steps.to_pylist()
    for r in range(3):
        assert [s["y_token"] for s in rows if s["replicate"] == r] == want


@pytest.mark.parametrize("make, field, value, words", [
    ("decoding", "compression_interval", 0, "compression_interval must be an integer >= 1; got 0"),
    ("decoding", "compression_interval", 2.5, "must be an integer >= 1; got 2.5"),
    ("decoding", "target_size", 0, "target_size must be an integer >= 1; got 0"),
    ("decoding", "hidden_states_buffer_size", -1, "must be an integer >= 0; got -1"),
    ("ratio", "target_compression_ratio", 1.0, "must be a number in [0, 1); got 1.0"),
    ("ratio", "compression_interval", True, "must be an integer >= 1; got True"),
    ("cam", "merge_budget", -2, "merge_budget must be an integer >= 0; got -2"),
    ("cam", "target_size", -5, "target_size must be an integer >= 1; got -5"),
])
def test_a_press_object_changed_after_construction_is_refused_in_one_line(make, field, value,
                                                                         words):
    """kvpress checks its fields in __post_init__ only; one set to 0 or below afterwards was a
    traceback after run.json (issue N4). kvdrift refuses it where it reads the rule, before
    anything is written."""
    import kvpress

    from kvdrift.lm.engine.decoding_presses import decoding_rule

    base = kvpress.KnormPress()
    press = {"decoding": lambda: kvpress.DecodingPress(base, compression_interval=4,
                                                        target_size=8),
             "ratio": lambda: kvpress.CompressionRatioDecodingPress(
                 base, compression_interval=4, target_compression_ratio=0.5),
             "cam": lambda: kvpress.CAMPress(base, compression_interval=4, target_size=8)}[make]()
    decoding_rule(press, "mine")  # as constructed: a rule
    object.__setattr__(press, field, value)
    with pytest.raises(ValueError) as err:
        decoding_rule(press, "mine")
    assert str(err.value).startswith("action 'mine': its ") and words in str(err.value)
    assert "\n" not in str(err.value)
