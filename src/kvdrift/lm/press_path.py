"""TEMPORARY STAND-IN for i43a's general press path (issue 43, part A): drop this file at
merge in favour of i43a's ``kvdrift.lm.press_path``.

It gives the user-facing side (``--presses``, press objects in the Python API) something to
run: a press object's prefill run inside the press exactly as kvpress runs it, and Q's prompt
cache as the press left it. Only what part B's tests need: presses that evict the same
number of entries in every KV head of a layer (no hidden entries, no decoding-time presses).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import DynamicCache

from kvdrift.lm.actions import Action
from kvdrift.lm.pair import LMKernelPair
from kvdrift.lm.prefill import PromptCache, as_prompt, unwrap_model
from kvdrift.lm.presses import fixed_press_randomness


class PressFailed(ValueError):
    """A press that raised or left a cache kvdrift cannot use (one line)."""


def press_pair(model: Any, prompt_ids: torch.Tensor, name: str, press: Any,
               reference: PromptCache | None = None) -> LMKernelPair:
    """The kernel pair of a press object: P the full cache, Q the cache the press left."""
    model = unwrap_model(model)
    ids = as_prompt(prompt_ids, model)
    cache = DynamicCache(config=model.config)
    try:
        with torch.no_grad(), press(model), fixed_press_randomness(ids.device):
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        compressed = PromptCache(keys=tuple(layer.keys for layer in cache.layers),
                                 values=tuple(layer.values for layer in cache.layers),
                                 logits=torch.zeros(1, 1), n_prompt=int(ids.shape[1]))
    except Exception as exc:  # noqa: BLE001 - a user's press: any failure is one line
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PressFailed(f"action {name!r}: the press {type(press).__name__} failed in the "
                          f"prefill: {type(exc).__name__}: {line}") from None
    pair = LMKernelPair(model, ids, Action(name=name), reference=reference)
    full = pair.prompt_cache("p")
    pair._prompt["q"] = dataclasses.replace(compressed, logits=full.logits)  # noqa: SLF001
    return pair
