"""The shared-prompt cache on its own: buffer sizes, appends, forks and joins against plain
tensor concatenation (an independent reference), and its refusals."""

from __future__ import annotations

import pytest
import torch

from kvdrift.lm.engine.cache import MIN_SPARE, SharedPromptCache, SharedPromptLayer, spare_slots

HEADS, DIM, PROMPT = 2, 3, 5


def gen(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, HEADS, length, DIM, generator=g),
            torch.randn(rows, HEADS, length, DIM + 1, generator=g))  # values may be wider


def prompt(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k, v = gen(1, PROMPT, seed)
    live = torch.rand(1, HEADS, PROMPT, generator=torch.Generator().manual_seed(seed)) > 0.3
    return k, v, live


def test_spare_slots_by_hand():
    assert [spare_slots(n) for n in (0, 1, 255, 256, 263, 264, 300, 4096)] == \
        [32, 32, 32, 32, 32, 33, 37, 512]
    assert MIN_SPARE == 32


@pytest.mark.parametrize("length", [0, 7, 300])
def test_a_new_layer_holds_its_entries_with_spare_room(length):
    pk, pv, live = prompt()
    k, v = gen(3, length, seed=1)
    layer = SharedPromptLayer(pk, pv, k, v, live)
    assert layer.capacity == length + max(32, length // 8)  # 300 -> 337
    assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    assert layer.get_seq_length() == length and layer.rows == 3
    assert layer.prompt_keys is pk and layer.prompt_values is pv and layer.prompt_live is live


def test_appends_match_concatenation_through_regrowth():
    """Append 1, 2 or 3 entries at a time up to 150: every step equals torch.cat of everything
    appended; the buffers regrow exactly when the next append would not fit, to the new length
    plus its spare slots, and a fill up to exactly the capacity does not regrow."""
    pk, pv, _ = prompt()
    k0, v0 = gen(2, 4, seed=2)
    layer = SharedPromptLayer(pk, pv, k0, v0)
    ref_k, ref_v = k0, v0
    capacity = layer.capacity
    assert capacity == 36
    seen_exact_fill = regrowths = 0
    step = 0
    while ref_k.shape[2] < 150:
        added = 1 if ref_k.shape[2] < 40 else 1 + step % 3  # ones fill 36 exactly
        step += 1
        k, v = gen(2, added, seed=100 + step)
        length = ref_k.shape[2]
        out_k, out_v = layer.update(k, v)
        ref_k, ref_v = torch.cat([ref_k, k], 2), torch.cat([ref_v, v], 2)
        assert torch.equal(out_k, ref_k) and torch.equal(out_v, ref_v)
        assert torch.equal(layer.keys, ref_k) and layer.get_seq_length() == ref_k.shape[2]
        if length + added > capacity:
            capacity = length + added + spare_slots(length + added)
            regrowths += 1
        seen_exact_fill += length + added == capacity
        assert layer.capacity == capacity
    assert regrowths >= 3 and seen_exact_fill >= 1


def test_take_copies_rows_and_keeps_the_prompt():
    pk, pv, live = prompt()
    k, v = gen(4, 40, seed=3)
    layer = SharedPromptLayer(pk, pv, k, v, live)
    part = layer.take(torch.tensor([3, 1]))
    assert torch.equal(part.keys, k[[3, 1]]) and torch.equal(part.values, v[[3, 1]])
    assert part.prompt_keys is pk and part.prompt_values is pv and part.prompt_live is live
    assert part.capacity == 40 + 32
    part.update(*gen(2, 1, seed=4))  # the fork writes into its own buffers
    assert torch.equal(layer.keys, k) and layer.get_seq_length() == 40


def test_join_pads_shorter_rows_and_keeps_order():
    pk, pv, live = prompt()
    (ka, va), (kb, vb) = gen(1, 300, seed=5), gen(2, 3, seed=6)
    a = SharedPromptLayer(pk, pv, ka, va, live)
    b = SharedPromptLayer(pk, pv, kb, vb, live)
    both = SharedPromptLayer.join([b, a], 300)
    assert both.rows == 3 and both.get_seq_length() == 300 and both.capacity == 337
    assert torch.equal(both.keys[0:2, :, :3], kb) and torch.equal(both.keys[2], ka[0])
    assert torch.equal(both.values[0:2, :, :3], vb) and torch.equal(both.values[2], va[0])
    assert not both.keys[0:2, :, 3:].any() and not both.values[0:2, :, 3:].any()  # zero pads
    assert both.prompt_live is live
    alone = SharedPromptLayer.join([a], 301)
    assert alone.get_seq_length() == 301 and torch.equal(alone.keys[:, :, :300], ka)
    with pytest.raises(ValueError, match="^only rows that share one prompt can be joined$"):
        SharedPromptLayer.join([a, SharedPromptLayer(pk.clone(), pv, kb, vb)], 300)


def test_cache_empty_take_and_join_layer_by_layer():
    prompts = [prompt(seed) for seed in (7, 8)]
    keys = tuple(p[0] for p in prompts)
    values = tuple(p[1] for p in prompts)
    live = (prompts[0][2], None)
    cache = SharedPromptCache.empty(keys, values, rows=3, prompt_live=live)
    assert cache.rows == 3 and len(cache.layers) == 2 and cache.get_seq_length() == 0
    for layer, k, v, m in zip(cache.layers, keys, values, live, strict=True):
        assert layer.prompt_keys is k and layer.prompt_values is v and layer.prompt_live is m
        assert tuple(layer.keys.shape) == (3, HEADS, 0, DIM)
        assert tuple(layer.values.shape) == (3, HEADS, 0, DIM + 1)
    assert all(layer.prompt_live is None
               for layer in SharedPromptCache.empty(keys, values, rows=1).layers)
    for i, layer in enumerate(cache.layers):
        layer.update(*gen(3, 2, seed=9 + i))  # every layer appends each step
    short = SharedPromptCache.empty(keys, values, rows=1, prompt_live=live)
    joined = SharedPromptCache.join([short, cache.take(torch.tensor([2]))])
    assert joined.rows == 2
    for layer, full in zip(joined.layers, cache.layers, strict=True):
        assert torch.equal(layer.keys[1], full.keys[2])
        assert not layer.keys[0].any()
    with pytest.raises(ValueError):
        SharedPromptCache.empty(keys, values, rows=1, prompt_live=live[:1])
    with pytest.raises(ValueError):
        SharedPromptCache.join([cache, SharedPromptCache(cache.layers[:1])])


def test_refusals_name_the_shapes():
    pk, pv, live = prompt()
    k, v = gen(2, 3, seed=10)
    with pytest.raises(ValueError, match="^the shared prompt must be a batch of one$"):
        SharedPromptLayer(pk.expand(2, -1, -1, -1), pv, k, v)
    with pytest.raises(ValueError, match="^the shared prompt must be a batch of one$"):
        SharedPromptLayer(pk, pv.expand(2, -1, -1, -1), k, v)
    with pytest.raises(ValueError, match=r"prompt_live must have shape \(1, 2, 5\); got "
                                         r"\(1, 2, 4\)"):
        SharedPromptLayer(pk, pv, k, v, live[..., :4])
    with pytest.raises(ValueError, match=r"generated keys \(2, 2, 3, 3\) and values "
                                         r"\(2, 2, 2, 4\) must be"):
        SharedPromptLayer(pk, pv, k, v[:, :, :2])
    with pytest.raises(ValueError, match=r"generated keys \(2, 3, 3\)"):
        SharedPromptLayer(pk, pv, k[0], v[0])
