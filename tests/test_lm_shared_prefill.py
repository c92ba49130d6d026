"""One prefill for P and every action: each action's cache equals its own prefill's exactly.

For every offered press family, scorer and chain, :func:`prefill_shared` (one forward, all
actions at once) must leave the same prompt cache as :func:`prefill` inside the action's own
press: the same keys and values, entry for entry and in the same order, in every layer and KV
head (so the same kept indices), the same hidden entries of head-adaptive presses, and P's
cache bit for bit. The factory serves a document's actions from one prefill, falls back to an
action's own prefill where the prefill itself changes (eager attention weights), and a pair built
from the shared caches steps exactly as one built from separate prefills.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvdrift.data.document import Document
from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.engine.prefill import PromptCache, own_prefill_reason, prefill, prefill_shared
from kvdrift.lm.factory import LMPairFactory
from tests.test_lm_presses import (
    DECODING,
    FAMILIES_TINY,
    LOGPROB_TOL,
    N_TINY,
    PLAIN,
    SMOLLM2,
    generate_once,
    greedy_pair,
    prompt,
)
from tests.test_lm_presses import smollm2 as smollm2  # noqa: F401  (fixture)
from tests.test_lm_presses import smollm2_ids as smollm2_ids  # noqa: F401  (fixture)

ALL = PLAIN + FAMILIES_TINY + DECODING + [
    "snapkv:ratio=0.9+knorm:ratio=0.8+random:ratio=0.5,seed=1",
    "leverage:ratio=0.5+cur:ratio=0.6,use_random_leverage=true",
    "snapkv:budget=1000",  # a budget keeping everything: P's cache itself
]
SHARED = [s for s in ALL if own_prefill_reason(parse_action(s)) is None]


def assert_same_cache(got: PromptCache, want: PromptCache, label: str) -> None:
    assert got.n_prompt == want.n_prompt
    assert len(got.keys) == len(want.keys)
    for i, (k, v, k0, v0) in enumerate(zip(got.keys, got.values, want.keys, want.values,
                                           strict=True)):
        assert torch.equal(k, k0), f"{label}: keys of layer {i}"
        assert torch.equal(v, v0), f"{label}: values of layer {i}"
    if want.live is None:
        assert got.live is None, label
    else:
        for i, (a, b) in enumerate(zip(got.live, want.live, strict=True)):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), \
                f"{label}: hidden entries of layer {i}"
    assert torch.equal(got.counts, want.counts), label


def test_only_eager_attention_presses_need_their_own_prefill():
    own = sorted(s for s in ALL if s not in SHARED)
    assert own == ["observed_attention:ratio=0.5"]
    with pytest.raises(ValueError, match="ObservedAttentionPress reads eager attention"):
        prefill_shared(torch.nn.Module(), torch.ones(1, 3, dtype=torch.long),
                       [parse_action("observed_attention:ratio=0.5")])


@pytest.mark.parametrize("n", [N_TINY, 5, 1])
def test_every_action_keeps_what_its_own_prefill_keeps(tiny_llama, n):
    # all actions in one forward: interleaving presses (and their random draws) changes nothing
    ids = prompt(n, seed=n)
    actions = [parse_action(s) for s in SHARED]
    shared = prefill_shared(tiny_llama, ids, actions)
    assert_same_cache(shared.reference, prefill(tiny_llama, ids), "full")
    assert torch.equal(shared.reference.logits, prefill(tiny_llama, ids).logits)
    for action in actions:
        want = prefill(tiny_llama, ids, action) if not action.prefill_is_noop(n) \
            else shared.reference
        assert_same_cache(shared.compressed[action.name], want, action.name)
        if action.prefill_is_noop(n):
            assert shared.compressed[action.name] is shared.reference


def test_one_action_alone_equals_it_among_others(tiny_llama):
    ids = prompt(N_TINY, seed=3)
    actions = [parse_action(s) for s in ("leverage:ratio=0.5", "adakv-snapkv:ratio=0.5",
                                         "random:ratio=0.4", "snapkv:ratio=0.5")]
    together = prefill_shared(tiny_llama, ids, actions).compressed
    for action in actions:
        alone = prefill_shared(tiny_llama, ids, [action]).compressed[action.name]
        assert_same_cache(together[action.name], alone, action.name)


def _hooks(model) -> dict[str, list]:
    """Each module's forward hooks (transformers installs inert output-capturing hooks of its
    own the first time a forward asks for attentions, e.g. tests/attribution_reference.py)."""
    return {name: list(m._forward_hooks.values()) for name, m in model.named_modules()}


def test_shared_prefill_leaves_model_and_callers_randomness_alone(tiny_llama):
    ids = prompt(N_TINY)
    before = _hooks(tiny_llama)
    torch.manual_seed(5)
    prefill_shared(tiny_llama, ids, [parse_action("leverage:ratio=0.5"),
                                     parse_action("adakv-knorm:ratio=0.5")])
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), after)
    assert _hooks(tiny_llama) == before  # every hook the presses placed is removed
    assert all(getattr(m, "masked_key_indices", None) is None for m in tiny_llama.modules())


@pytest.mark.parametrize("spec", ["snapkv:ratio=0.5", "adakv-snapkv:ratio=0.5",
                                  "snapkv:ratio=0.5+decoding-knorm:interval=5,target=40",
                                  "pyramidkv:ratio=0.5"])
def test_pair_from_shared_caches_steps_as_before(tiny_llama, spec):
    ids = prompt(N_TINY, seed=7)
    before = LMKernelPair(tiny_llama, ids, spec)
    shared = prefill_shared(tiny_llama, ids, [parse_action(spec)])
    after = LMKernelPair(tiny_llama, ids, spec, reference=shared.reference,
                         compressed=shared.compressed[spec])
    t0, lp0 = greedy_pair(before, 8)
    t1, lp1 = greedy_pair(after, 8)
    assert t0 == t1 and torch.equal(lp0, lp1)


class TinyFactory(LMPairFactory):
    """The pair factory on the tiny model; a document's prompt is random ids of its length."""

    def __init__(self, model, **kwargs):
        super().__init__(SimpleNamespace(model=model, tokenizer=None), chat_template=False,
                         **kwargs)

    def prompt_ids(self, doc):
        return prompt(len(doc.prompt), seed=len(doc.prompt))


SPECS = ["snapkv-half", "recent-half", "snapkv:budget=20", "full", "observed_attention:ratio=0.5",
         "adakv-snapkv:ratio=0.5"]


def test_factory_serves_a_documents_actions_from_one_prefill(tiny_llama):
    factory = TinyFactory(tiny_llama)
    docs = [Document(id="a", prompt="x" * 40), Document(id="b", prompt="y" * 50)]
    for i, doc in enumerate(docs):
        factory.prepare(doc, SPECS)
        for spec in SPECS:
            pair = factory(doc, spec)
            want = LMKernelPair(tiny_llama, factory.prompt_ids(doc), spec)
            assert_same_cache(pair.prompt_cache("q"), want.prompt_cache("q"), spec)
            assert_same_cache(pair.prompt_cache("p"), want.prompt_cache("p"), spec)
        # one shared forward, plus observed_attention's own prefill with eager attention
        assert factory.prefills == 2 * (i + 1)
        assert not factory._waiting


def test_factory_without_a_plan_and_with_a_small_cache_bound(tiny_llama):
    doc = Document(id="a", prompt="x" * 40)
    factory = TinyFactory(tiny_llama)  # not told the actions: P and each action, one forward
    for spec in SPECS[:3]:
        factory(doc, spec)
    assert factory.prefills == 1 + 2  # the first forward also gave P
    bounded = TinyFactory(tiny_llama, cache_fraction=1.0)  # three halves do not fit together
    bounded.prepare(doc, SPECS[:3])
    for spec in SPECS[:3]:
        pair = bounded(doc, spec)
        want = LMKernelPair(tiny_llama, bounded.prompt_ids(doc), spec)
        assert_same_cache(pair.prompt_cache("q"), want.prompt_cache("q"), spec)
    assert bounded.prefills == 2  # {snapkv-half, recent-half}, then {budget=20}


def test_resumed_runner_prepares_only_unfinished_units(tiny_llama, tmp_path):
    from kvdrift.run.runner import RunConfig, run_units
    from kvdrift.run.store import RunStore

    docs = [Document(id="a", prompt="x" * 30)]
    config = RunConfig(model="tiny", actions=("snapkv-half", "recent-half", "full"),
                       replicates=2, horizon=3, seed=1)
    store = RunStore.open(tmp_path, config.as_dict())
    factory = TinyFactory(tiny_llama)
    first = RunConfig(**{**config.as_dict(), "actions": ("snapkv-half",)})
    assert run_units(first, docs, factory, store) == 1
    plans = []
    resumed = TinyFactory(tiny_llama)
    resumed.prepare = lambda doc, actions: (plans.append(list(actions)),
                                            TinyFactory.prepare(resumed, doc, actions))
    assert run_units(config, docs, resumed, store) == 2
    assert plans == [["recent-half", "full"]] and resumed.prefills == 1


# --- SmolLM2 -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_shared(smollm2, smollm2_ids):  # noqa: F811
    """Every SmolLM2 table action's cache from one shared prefill of the fjord prompt."""
    actions = [parse_action(s) for s in SMOLLM2 if own_prefill_reason(parse_action(s)) is None]
    return prefill_shared(smollm2, smollm2_ids, actions)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [s for s in SMOLLM2 + ["snapkv-half", "recent-half",
                                                        "snapkv-512"]
                                  if own_prefill_reason(parse_action(s)) is None])
def test_shared_caches_on_smollm2_equal_own_prefill_and_generate(
        smollm2, smollm2_ids, smollm2_shared, kvpress_runs, spec):  # noqa: F811
    action = parse_action(spec)
    n = smollm2_ids.shape[1]
    if spec not in smollm2_shared.compressed:
        shared = prefill_shared(smollm2, smollm2_ids, [action])
    else:
        shared = smollm2_shared
    want = prefill(smollm2, smollm2_ids, action) if not action.prefill_is_noop(n) \
        else shared.reference
    assert_same_cache(shared.compressed[spec], want, spec)
    pair = LMKernelPair(smollm2, smollm2_ids, action, reference=shared.reference,
                        compressed=shared.compressed[spec])
    tokens, lps = greedy_pair(pair, 8)
    gen, gen_lps = generate_once(kvpress_runs, smollm2, smollm2_ids, action, 8)
    assert tokens == gen, spec
    assert float((lps - gen_lps).abs().max()) < LOGPROB_TOL, spec


def test_ray_worker_prepares_each_document_once_with_its_pending_actions(tiny_llama):
    from kvdrift.run.executors.ray import UnitWorker
    from kvdrift.run.runner import RunConfig

    factory = TinyFactory(tiny_llama)
    worker = UnitWorker(lambda: factory)
    config = RunConfig(model="tiny", actions=("snapkv-half", "recent-half", "full"),
                       replicates=2, horizon=3)
    doc = Document(id="a", prompt="x" * 30)
    pending = ("recent-half", "full")  # snapkv-half was stored before an interruption
    for action in pending:
        worker.run(config, doc, action, pending)
    assert factory.prefills == 1 and not factory._waiting
