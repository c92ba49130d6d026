"""Every "not offered" reason is enforced the same way for press objects as for specs, and
the presses once listed there that do run with their data supplied locally are measured."""

from __future__ import annotations

import kvpress
import numpy as np
import pytest

from kvdrift.data.document import Document
from kvdrift.lm.actions.identity import check_press
from kvdrift.lm.actions.presses import GENERAL_PATH, NOT_OFFERED
from kvdrift.lm.actions.spec import parse_action


@pytest.mark.parametrize("press", [
    kvpress.FinchPress(compression_ratio=0.5),
    kvpress.ComposedPress([kvpress.KnormPress(0.2), kvpress.FinchPress(0.2)]),
])
def test_a_press_object_of_a_class_not_offered_is_refused_as_its_spec(press):
    inner = next(p for p in (press, *getattr(press, "presses", ())) if type(p).__name__
                 in NOT_OFFERED)
    name = type(inner).__name__
    with pytest.raises(ValueError) as as_object:
        check_press(press, "mine")
    with pytest.raises(ValueError) as as_spec:
        parse_action(f"{name}:ratio=0.5")
    assert str(as_object.value) == f"action 'mine': kvpress's {name} is not offered: " \
        f"{NOT_OFFERED[name]}"
    assert NOT_OFFERED[name] in str(as_spec.value)


def test_duo_attention_and_lukv_are_press_objects_not_refusals():
    assert "DuoAttentionPress" not in NOT_OFFERED and "LUKVPress" not in NOT_OFFERED
    assert "head pattern" in GENERAL_PATH["DuoAttentionPress"]
    assert "_budget_curves" in GENERAL_PATH["LUKVPress"]


def test_lukv_runs_with_its_budget_curves_supplied(tiny_model_dir):
    """LU-KV offline: with its curves set on the press before the run it is measured (its
    kept counts per KV head follow the curve), without any download."""
    from kvdrift.lm.factory import LMPairFactory
    from kvdrift.lm.loading.model import load_model

    loaded = load_model(str(tiny_model_dir))
    press = kvpress.LUKVPress(press=kvpress.KnormPress(), compression_ratio=0.5)
    config = loaded.model.config
    shape = (99, config.num_hidden_layers, config.num_key_value_heads)  # prune ratio per %
    press._budget_curves = np.broadcast_to(np.arange(1, 100)[:, None, None] / 100, shape).copy()
    check_press(press, "lukv")
    factory = LMPairFactory(loaded, presses={"lukv": press})
    pair = factory(Document("d0", "The cat sat on the mat and looked around. " * 8), "lukv")
    q = pair.prompt_cache("q")
    n = pair.prompt_cache("p").n_prompt
    assert int(q.counts.sum()) < q.counts.numel() * n  # it evicted
    kv_bytes, fraction = pair.kv_memory()
    assert 0.4 < fraction < 0.6


def test_duo_attention_runs_with_its_head_pattern_supplied(tiny_model_dir):
    """DuoAttention offline: its head pattern put where kvpress looks it up first (its cache,
    keyed by the model's name_or_path) before the run; half the heads stream."""
    from kvpress.presses import duo_attention_press

    from kvdrift.lm.factory import LMPairFactory
    from kvdrift.lm.loading.model import load_model

    loaded = load_model(str(tiny_model_dir))
    config = loaded.model.config
    scores = np.arange(config.num_hidden_layers * config.num_key_value_heads, dtype=float)
    duo_attention_press.cache[config.name_or_path] = (
        4, 8, scores.reshape(config.num_hidden_layers, config.num_key_value_heads))
    try:
        press = kvpress.DuoAttentionPress(head_compression_ratio=0.5)
        factory = LMPairFactory(loaded, presses={"duo": press})
        pair = factory(Document("d0", "The cat sat on the mat and looked around. " * 8), "duo")
    finally:
        duo_attention_press.cache.pop(config.name_or_path, None)
    q, n = pair.prompt_cache("q"), pair.prompt_cache("p").n_prompt
    counts = q.counts.flatten().tolist()
    assert sorted(counts) == [4 + 8] * (len(counts) // 2) + [n] * (len(counts) // 2)
