"""The LM pair's refusals, named whole, and where its EOS id and prompt shape come from
(tiny in-memory Llama)."""

from __future__ import annotations

import re

import pytest
import torch

from kvdrift.lm.pair import LMKernelPair, PromptCache


def whole(message: str) -> str:
    return f"^{re.escape(message)}$"


def kv(entries: int, heads: int = 2) -> torch.Tensor:
    return torch.zeros(1, heads, entries, 4)


LOGITS = torch.zeros(1, 8)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"keys": (), "values": ()},
     "a prompt cache needs the same positive number of key and value layers"),
    ({"keys": (kv(3), kv(3)), "values": (kv(3),)},
     "a prompt cache needs the same positive number of key and value layers"),
    ({"keys": (kv(3),), "values": (kv(2),)},
     "keys and values of a layer must hold the same number of entries"),
    ({"keys": (kv(3),), "values": (kv(3),), "live": (None, None)},
     "live needs one entry per layer (1); got 2"),
    ({"keys": (kv(3),), "values": (kv(3),), "n_prompt": 2},
     "kept entries must be in [1, 2] in every layer and KV head; got [[3, 3]]"),
    ({"keys": (kv(3),), "values": (kv(3),), "live": (torch.tensor([[[1, 0, 0], [0, 0, 0]]],
                                                                  dtype=torch.bool),)},
     "kept entries must be in [1, 3] in every layer and KV head; got [[1, 0]]"),
])
def test_prompt_cache_refusals(kwargs, message):
    args = {"logits": LOGITS, "n_prompt": 3} | kwargs
    with pytest.raises(ValueError, match=whole(message)):
        PromptCache(**args)


def test_a_cache_of_one_layer_keeping_one_entry_is_valid():
    one = torch.tensor([[[0, 1, 0], [1, 0, 0]]], dtype=torch.bool)
    cache = PromptCache(keys=(kv(3),), values=(kv(3),), logits=LOGITS, n_prompt=3, live=(one,))
    assert cache.counts.tolist() == [[1, 1]] and cache.kept == 1


@pytest.mark.parametrize(("prompt", "message"), [
    (torch.zeros(2, 5, dtype=torch.long), "prompt_ids must have shape [n] or [1, n]; got (2, 5)"),
    (torch.zeros(1, 1, 5, dtype=torch.long),
     "prompt_ids must have shape [n] or [1, n]; got (1, 1, 5)"),
    (torch.zeros(1, 0, dtype=torch.long),
     "prompt_ids is empty; a document needs at least one token"),
    (torch.zeros(1, 5), "prompt_ids must be integer token ids; got dtype torch.float32"),
])
def test_prompt_refusals(tiny_llama, prompt, message):
    with pytest.raises(ValueError, match=whole(message)):
        LMKernelPair(tiny_llama, prompt, "full")


def test_a_flat_prompt_is_one_document(tiny_llama):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (12,), generator=gen, dtype=torch.int32)
    flat = LMKernelPair(tiny_llama, ids, "snapkv-half")
    batch = LMKernelPair(tiny_llama, ids.long()[None], "snapkv-half")
    assert flat.n_prompt == 12
    for side in ("p", "q"):
        assert torch.equal(flat.logprobs(flat.start(side, 1)), batch.logprobs(batch.start(side, 1)))


def test_path_operation_refusals(tiny_llama):
    pair = LMKernelPair(tiny_llama, torch.arange(3, 23)[None], "snapkv-half")
    state = pair.advance(pair.start("q", 2), torch.tensor([5, 6]))
    cases = [
        (lambda: pair.start("p", 0), "number of rows must be an integer >= 1; got 0"),
        (lambda: pair.start("p", 1.5), "number of rows must be an integer >= 1; got 1.5"),
        (lambda: pair.advance(state, torch.tensor([-1, 4])),
         "tokens must be in [0, 128); got [-1, 4]"),
        (lambda: pair.advance(state, torch.tensor([1, 128])),
         "tokens must be in [0, 128); got [1, 128]"),
        (lambda: pair.advance(state, torch.tensor([1])), "need one token per row (2); got 1"),
        (lambda: pair.truncate(state, torch.tensor([-1, 0])),
         "lengths must be in [0, current length]; got [-1, 0] for current [1, 1]"),
        (lambda: pair.truncate(state, torch.tensor([2, 0])),
         "lengths must be in [0, current length]; got [2, 0] for current [1, 1]"),
        (lambda: pair.truncate(state, torch.tensor([0])),
         "lengths must have one entry per row (2); got 1"),
        (lambda: pair.select(state, torch.tensor([], dtype=torch.long)),
         "select needs at least one row"),
        (lambda: pair.select(state, torch.tensor([-1])), "rows must be in [0, 2); got [-1]"),
        (lambda: pair.select(state, torch.tensor([0, 2])), "rows must be in [0, 2); got [0, 2]"),
        (lambda: pair.join([]), "join needs at least one state"),
        (lambda: pair.join([pair.start("p", 1), state]),
         "only states of one side can be joined; got ['p', 'q']"),
        (lambda: pair.join([state, pair.start("p", 1)]),
         "only states of one side can be joined; got ['p', 'q']"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=whole(message)):
            make()


@pytest.mark.parametrize(("generation_eos", "config_eos", "want"), [
    ([5, 7], 2, 5),  # a list: its first entry
    (6, 2, 6),  # the generation config before the model config
    ([], 2, 2),  # an empty list says nothing: the model config's
    (None, 3, 3),
    (None, None, None),
])
def test_eos_comes_from_the_generation_config_first(tiny_llama, generation_eos, config_eos,
                                                    want):
    saved = (tiny_llama.generation_config.eos_token_id, tiny_llama.config.eos_token_id)
    try:
        tiny_llama.generation_config.eos_token_id = generation_eos
        tiny_llama.config.eos_token_id = config_eos
        pair = LMKernelPair(tiny_llama, torch.arange(3, 13)[None], "full")
        assert pair.eos_token_id == want
        explicit = LMKernelPair(tiny_llama, torch.arange(3, 13)[None], "full", eos_token_id=9)
        assert explicit.eos_token_id == 9
    finally:
        tiny_llama.generation_config.eos_token_id, tiny_llama.config.eos_token_id = saved


def test_eos_without_a_generation_config(tiny_llama):
    saved = tiny_llama.generation_config
    try:
        tiny_llama.generation_config = None
        assert LMKernelPair(tiny_llama, torch.arange(3, 13)[None], "full").eos_token_id == 2
    finally:
        tiny_llama.generation_config = saved
