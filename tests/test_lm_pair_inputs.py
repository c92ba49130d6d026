"""The LM pair's refusals, named whole, and where its EOS id and prompt shape come from
(tiny in-memory Llama)."""

from __future__ import annotations

import pytest
import torch
from messages import whole

from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.engine.prefill import PromptCache


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


def test_consumed_state_is_named_whole(tiny_llama):
    pair = LMKernelPair(tiny_llama, torch.arange(3, 23)[None], "snapkv-half")
    state = pair.start("q", 2)
    pair.advance(state, torch.tensor([1, 2]))
    message = ("path state was already consumed (cache and mask lengths differ); "
               "advance/truncate may reuse storage, so use the returned state")
    with pytest.raises(RuntimeError, match=whole(message)):
        pair.advance(state, torch.tensor([1, 2]))


def test_sliding_window_models_are_refused():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           sliding_window=8, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    with pytest.raises(NotImplementedError, match=whole(
            "sliding-window attention layers are not supported by kvdrift")):
        LMKernelPair(model, torch.arange(3, 23)[None], "full")


def test_a_loaded_model_is_unwrapped(tiny_llama):
    from kvdrift.lm.loading.model import LoadedModel

    loaded = LoadedModel(model=tiny_llama, tokenizer=None, name="tiny", device=torch.device("cpu"),
                         dtype=torch.float32)
    ids = torch.arange(3, 23)[None]
    pair, bare = LMKernelPair(loaded, ids, "snapkv-half"), LMKernelPair(tiny_llama, ids,
                                                                         "snapkv-half")
    assert pair.model is tiny_llama
    assert torch.equal(pair.logprobs(pair.start("q", 1)), bare.logprobs(bare.start("q", 1)))


def test_a_model_without_a_context_limit_takes_any_prompt(tiny_llama):
    saved = tiny_llama.config.max_position_embeddings
    try:
        del tiny_llama.config.max_position_embeddings
        assert LMKernelPair(tiny_llama, torch.arange(3, 23)[None], "full").n_prompt == 20
    finally:
        tiny_llama.config.max_position_embeddings = saved


def test_eos_of_a_model_without_generation_config_attribute():
    from types import SimpleNamespace

    from kvdrift.lm.engine.pair import _primary_eos

    assert _primary_eos(SimpleNamespace(config=SimpleNamespace(eos_token_id=[4, 5]))) == 4
    assert _primary_eos(SimpleNamespace(config=SimpleNamespace())) is None


def test_head_adaptive_prefill_leaves_no_hidden_entries_behind(tiny_llama):
    """kvpress marks hidden entries on the attention modules; a later prefill (or `generate`)
    on the same model must not see them."""
    ids = torch.arange(3, 43)[None]
    LMKernelPair(tiny_llama, ids, "adakv-snapkv:ratio=0.5")
    marked = [getattr(m, "masked_key_indices", None) for m in tiny_llama.modules()
              if hasattr(m, "o_proj")]
    assert marked and all(m is None for m in marked)


def test_joining_one_state_gives_it_back(tiny_llama):
    for action in ("snapkv-half", "decoding-knorm:interval=3,target=24"):
        pair = LMKernelPair(tiny_llama, torch.arange(3, 23)[None], action)
        state = pair.start("q", 2)
        for t in range(5):
            state = pair.advance(state, torch.tensor([t + 3, t + 7]))
        one = pair.join([state])
        assert torch.equal(pair.logprobs(one), pair.logprobs(state))
        nxt = torch.tensor([9, 11])
        assert torch.equal(pair.logprobs(pair.advance(one, nxt)),
                           pair.logprobs(pair.advance(state, nxt)))


def test_truncate_then_new_tokens_equals_a_fresh_path(tiny_llama):
    """After a truncate, the path forgets the compressions made on the dropped tokens: going on
    along different tokens gives what a fresh path along that history gives."""
    action = "decoding-knorm:interval=3,target=22"
    pair = LMKernelPair(tiny_llama, torch.arange(3, 23)[None], action)
    old, new = [5, 9, 13, 17, 21, 25, 29, 33], [5, 9, 40, 41, 42, 43, 44, 45]
    state = pair.start("q", 1)
    for tok in old:
        state = pair.advance(state, torch.tensor([tok]))
    branch = pair.truncate(state, torch.tensor([2]))
    fresh = pair.start("q", 1)
    for tok in new[:2]:
        fresh = pair.advance(fresh, torch.tensor([tok]))
    for tok in new[2:]:
        branch = pair.advance(branch, torch.tensor([tok]))
        fresh = pair.advance(fresh, torch.tensor([tok]))
    assert torch.allclose(pair.logprobs(branch), pair.logprobs(fresh), atol=1e-5, rtol=0)


def test_decode_eviction_inputs_keep_the_model_dtype(tiny_llama):
    import copy

    half = copy.deepcopy(tiny_llama).to(torch.bfloat16)
    pair = LMKernelPair(half, torch.arange(3, 23)[None], "decoding-knorm:interval=3,target=22")
    state = pair.advance(pair.start("q", 1), torch.tensor([5]))
    assert {t.dtype for t in state.evictions.inputs} == {torch.bfloat16}


def test_first_step_is_p_exactly_even_when_the_press_prefills_eagerly(tiny_llama):
    """Eviction acts after the prefill, so Q's first next-token law is P's. An observed-attention
    press prefills with eager attention (its logits differ from SDPA's by ~1e-6); the pair uses
    the full-cache prefill's logits for both sides, so TV at t = 1 is exactly 0."""
    ids = torch.randint(3, 128, (1, 60), generator=torch.Generator().manual_seed(0))
    pair = LMKernelPair(tiny_llama, ids, "observed-attention:ratio=0.5")
    assert torch.equal(pair.logprobs(pair.start("q", 1)), pair.logprobs(pair.start("p", 1)))
