"""Actions: parsing, budget rules, exact kvpress rounding, and clear errors."""

from __future__ import annotations

import dataclasses

import pytest
from kvpress.utils import compute_n_kept

from kvdrift.lm.actions import NAMED_ACTIONS, PRESS_NAMES, Action, parse_action

EXPECTED_KEPT = {
    "full": lambda n: n,
    "snapkv-half": lambda n: max(1, n // 2),
    "snapkv-90": lambda n: max(1, 9 * n // 10),
    "snapkv-512": lambda n: min(512, n),
    "recent-half": lambda n: max(1, n // 2),
    "recent-90": lambda n: max(1, 9 * n // 10),
}


def test_named_actions_are_the_documented_ones():
    assert set(NAMED_ACTIONS) == set(EXPECTED_KEPT)
    assert parse_action("snapkv-half").press == "SnapKVPress"
    assert parse_action("recent-90").press == "StreamingLLMPress"
    assert parse_action("full").press is None


@pytest.mark.parametrize("name", sorted(EXPECTED_KEPT))
def test_named_kept_counts(name):
    action = parse_action(name)
    for n in [1, 2, 3, 9, 10, 11, 63, 64, 65, 99, 100, 511, 512, 513, 1000, 4096, 32768]:
        assert action.kept(n) == EXPECTED_KEPT[name](n), (name, n)
        assert 1 <= action.kept(n) <= n


@pytest.mark.parametrize("spec", [*sorted(EXPECTED_KEPT), "snapkv:budget=1", "knorm:budget=7",
                                  "tova:ratio=0.3", "streaming_llm:ratio=0.25", "snapkv:ratio=1"])
def test_compression_ratio_lands_on_exact_count_under_kvpress_rounding(spec):
    action = parse_action(spec)
    for n in range(1, 2049):
        kept = action.kept(n)
        if action.is_noop(n):
            assert action.make_press(n) is None
            continue
        ratio = action.compression_ratio(n)
        assert 0.0 <= ratio < 1.0
        assert compute_n_kept(n, ratio) == kept, (spec, n)
        # StreamingLLMPress prunes n - int(n * (1 - ratio)) entries: the same rounding
        assert n - int(n * (1 - ratio)) == n - kept


def test_general_form():
    a = parse_action("knorm:ratio=0.5")
    assert (a.press, a.ratio, a.budget) == ("KnormPress", 0.5, None)
    b = parse_action("snapkv:budget=256")
    assert (b.press, b.ratio, b.budget) == ("SnapKVPress", None, 256)
    assert (b.kept(1000), b.kept(100)) == (256, 100)
    c = parse_action("streaming_llm:ratio=0.25")
    assert c.press == "StreamingLLMPress" and c.kept(100) == 25
    assert parse_action("recent:ratio=0.25").press == "StreamingLLMPress"
    assert parse_action("SnapKVPress:budget=3").press == "SnapKVPress"
    d = parse_action("snapkv:budget=8,window_size=16,kernel_size=3")
    assert d.kwargs == (("kernel_size", 3), ("window_size", 16))
    press = d.make_press(100)
    assert (press.window_size, press.kernel_size) == (16, 3)
    assert parse_action(d.name) == d
    assert str(d) == d.name


def test_every_registered_press_parses():
    for short in PRESS_NAMES:
        assert parse_action(f"{short}:ratio=0.5").kept(10) == 5


def test_budget_at_least_prompt_is_noop():
    action = parse_action("snapkv-512")
    assert action.is_noop(512) and action.is_noop(100) and not action.is_noop(513)
    assert action.make_press(300) is None
    assert action.compression_ratio(300) == 0.0


def test_short_prompt_fields_are_clamped():
    press = parse_action("snapkv-half").make_press(40)
    assert press.window_size == 39  # kvpress asserts q_len > window_size
    assert parse_action("snapkv-half").make_press(1000).window_size == 64
    assert parse_action("recent-half").make_press(3).n_sink == 2
    assert parse_action("recent-half").make_press(100).n_sink == 4


def test_kept_is_never_empty():
    for spec in ["snapkv:ratio=0.01", "knorm:budget=1", "snapkv-half"]:
        assert parse_action(spec).kept(1) == 1
        assert parse_action(spec).kept(2) == 1


def test_action_is_frozen_and_validated():
    action = parse_action("snapkv-half")
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.ratio = 0.3  # type: ignore[misc]
    with pytest.raises(ValueError, match="exactly one"):
        Action(name="x", press="SnapKVPress", ratio=0.5, budget=3)
    with pytest.raises(ValueError, match="no-eviction"):
        Action(name="x", press=None, ratio=0.5)


def test_unknown_name_lists_named_actions():
    with pytest.raises(ValueError) as info:
        parse_action("snapkv-quarter")
    message = str(info.value)
    for name in NAMED_ACTIONS:
        assert name in message
    assert "snapkv-quarter" in message


@pytest.mark.parametrize("spec,match", [
    ("snapkv:ratio=0", r"ratio .* \(0, 1\]"),
    ("snapkv:ratio=1.5", r"ratio .* \(0, 1\]"),
    ("knorm:ratio=-0.2", r"ratio .* \(0, 1\]"),
    ("snapkv:budget=0", r"budget .* >= 1"),
    ("snapkv:budget=-3", r"budget .* >= 1"),
    ("snapkv:budget=2.5", r"budget .* integer"),
    ("snapkv:ratio=abc", r"ratio must be a number"),
    ("snapkv:window=32,ratio=0.5", r"unknown SnapKVPress field 'window'.*window_size"),
    ("knorm:ratio=0.5,n_sink=2", r"unknown KnormPress field 'n_sink'"),
    ("nosuchpress:ratio=0.5", r"unknown press 'nosuchpress'.*snapkv"),
    ("snapkv:", r"exactly one"),
    ("snapkv:ratio=0.5,budget=3", r"exactly one"),
    ("snapkv:ratio", r"key=value"),
    ("snapkv:compression_ratio=0.5", r"not compression_ratio"),
    ("", r"empty action"),
])
def test_bad_specs_raise_clear_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_action(spec)


def test_kept_rejects_bad_prompt_length():
    with pytest.raises(ValueError, match="prompt length"):
        parse_action("snapkv-half").kept(0)
