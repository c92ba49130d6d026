"""Kernel pairs for a stream of (document, action) units on one loaded model.

A document's actions share one prefill forward: told the actions about to be asked for
(:meth:`LMPairFactory.prepare`), the factory computes P's cache and every such action's
compressed cache in one forward (:func:`~kvdrift.lm.engine.prefill.prefill_shared`) and hands each
out when its pair is asked for. Actions that change the prefill computation (eager attention
weights) run their own prefill. Only the last document is kept, so a stale cache is never
reused, and an interrupted document recomputes its prefill once.

Actions named in ``presses`` (action name -> kvpress press object) take the general path of
:mod:`kvdrift.lm.engine.press_path` instead: P's cache is the same shared full prefill, Q's is the
prompt's prefill run inside the press object, as the press left it.

A document with a question (kvpress's pipeline protocol) has only its context compressed:
the factory prefills the context as above, then appends the question to each side's cache
(:mod:`kvdrift.lm.engine.question`). Consecutive documents over the same context (several
questions) share its compressions: one compression per action, each question a unit.

An :class:`LMPairSource` names a model instead of holding one, so that a process that
computes units elsewhere (a Ray worker) can build its own factory from it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvdrift.data.document import Document
from kvdrift.lm.actions.attention_use import nested_presses
from kvdrift.lm.actions.identity import check_press
from kvdrift.lm.actions.spec import Action, parse_action
from kvdrift.lm.engine.decoding_cam import SWRB_REFUSAL, CamRule
from kvdrift.lm.engine.decoding_presses import decoding_rule, stage_rule
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.engine.prefill import PromptCache, own_prefill_reason, prefill, prefill_shared
from kvdrift.lm.engine.press_path import (
    PressCache,
    PressFailed,
    press_prompt_cache,
    stored_memory,
)
from kvdrift.lm.engine.press_rules import prompt_problem, wrapped_problem
from kvdrift.lm.engine.question import after_context_refusal, append_question, press_refusal
from kvdrift.lm.engine.question_decoding import question_start, replays_over_question
from kvdrift.lm.generators.build import (
    Generator,
    build_generator,
    check_models_fit_memory,
    check_spec_fits,
    given_generator,
    load_side_model,
)
from kvdrift.lm.generators.pair import GeneratorPair
from kvdrift.lm.grammar.model_spec import parse_model, split_model
from kvdrift.lm.loading.model import (
    LoadedModel,
    encode_prompt,
    encode_split,
    layers_of,
    load_tokenizer,
    sliding_window_refusal,
    text_config,
    window_of,
)
from kvdrift.lm.loading.prompt_fit import window_refusal
from kvdrift.lm.model_state import ModelState, refusal
from kvdrift.lm.quantized.transform import Quantization, is_quantization, parse_quantization

SHARED_CACHE_FRACTION = 2.0
"""Most kept entries one shared prefill holds for actions not yet served, as a multiple of P's
cache (the method's three actions on a 2K prompt hold 1.26); more actions take more forwards."""


class LMPairFactory:
    """Callable ``(document, action) -> LMKernelPair`` for the runner.

    ``prepare(document, actions)`` announces the actions of a document about to be asked for,
    in order, so that one prefill forward serves them all (module docstring); without it each
    pair still gets P's and its own cache from one forward. ``presses`` maps action names to
    kvpress press objects, which take the general path (module docstring); those named in
    ``eager`` prefill with eager attention (as do presses that read attention weights).

    An action whose Q is another model (``<action>@<model>``, or a name in ``generators``: a
    model handed over, measured with its full cache) gets a
    :class:`~kvdrift.lm.generators.pair.GeneratorPair`: P's side from this factory, Q's from a
    factory of Q's model (built once: :mod:`~kvdrift.lm.generators.build`), which shares its
    prefill between the document's actions on that model as this one does.
    """

    def __init__(self, loaded: LoadedModel, chat_template: bool = True,
                 cache_fraction: float = SHARED_CACHE_FRACTION,
                 presses: Mapping[str, object] | None = None,
                 eager: Sequence[str] = (),
                 generators: Mapping[str, LoadedModel] | None = None,
                 allow_download: bool = False):
        self.loaded = loaded
        self.allow_download = allow_download
        # Q's models: handed over by action name, or built from ``@<model>`` on first use
        self.given = dict(generators or {})
        self._generators: dict[str, Generator] = {}  # by model spec text or given name
        self._q_factories: dict[str, LMPairFactory] = {}
        self.eager = frozenset(eager)  # press actions whose prefill runs eager attention
        self.chat_template = chat_template
        self.cache_fraction = cache_fraction
        self.presses = dict(presses or {})
        for name, press in self.presses.items():
            check_press(press, name)
        self._doc_id: str | None = None
        self._ids = None  # the whole prompt's ids (with a question: context, then question)
        self._compressed_ids = None  # the ids actions compress (the context, with a question)
        self._question_ids = None  # [1, q] or None (whole-prompt document)
        self._reference: PromptCache | None = None  # P's cache of the compressed ids
        self._waiting: dict[str, PromptCache] = {}  # computed, not yet served
        self._general_caches: dict[str, PressCache] = {}  # a context's press-object caches
        self._answered: PromptCache | None = None  # P's cache with the question appended
        self._planned: list[str] = []
        self.prefills = 0  # prefill forwards run so far (for benchmarks and tests)
        self._before_press: ModelState | None = None  # the model before this unit's press

    @property
    def identity(self) -> dict[str, str]:
        """The loaded model's weights and tokenizer digests (computed once per model), which
        each unit's fingerprint records."""
        return self.loaded.identity

    def prompt_ids(self, doc: Document):
        """Token ids ``[1, n]`` of a document's prompt (chat template applied if enabled): what
        the model runs on, the attribution reads and the store records."""
        if doc.id == self._doc_id and self._ids is not None:
            return self._ids
        if doc.question is None:
            return encode_prompt(self.loaded.tokenizer, doc.prompt, self.chat_template)
        return torch.cat(self._split(doc), dim=1)

    def _split(self, doc: Document) -> tuple[torch.Tensor, torch.Tensor]:
        return encode_split(self.loaded.tokenizer, doc.prompt, doc.question or "",
                            self.chat_template)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of generated token ids (special tokens dropped): what task scores read."""
        return self.loaded.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def prepare(self, doc: Document, actions: Sequence[str]) -> None:
        """The actions of ``doc`` about to be asked for, in order (replaces an earlier plan)."""
        self._document(doc)
        names = [str(a).strip() for a in actions]
        self._planned = [a for a in names if a not in self.presses and not self._two_models(a)]
        by_model: dict[str, list[str]] = {}
        for name in filter(self._two_models, names):
            label, cache = self._q_parts(name)
            by_model.setdefault(label, []).append(cache)
        for label, caches in by_model.items():
            if label in self._q_factories:  # built models only: a plan never builds one
                self._q_factories[label].prepare(doc, caches)

    def _document(self, doc: Document) -> None:
        if doc.id == self._doc_id:
            return
        planned = self._planned
        if doc.question is None:
            context, question = self.prompt_ids(doc), None
        else:
            context, question = self._split(doc)
        same_context = (question is not None and self._question_ids is not None
                        and torch.equal(context, self._compressed_ids))
        self._doc_id = None
        if not same_context:  # never reuse a stale prefill
            self._reference, self._waiting, self._general_caches = None, {}, {}
            planned = []
        self._planned, self._answered = planned, None
        self._compressed_ids, self._question_ids = context, question
        self._ids = context if question is None else torch.cat([context, question], dim=1)
        self._doc_id = doc.id

    def _two_models(self, action: str) -> bool:
        """Whether ``action``'s Q runs on another model than P's."""
        return action in self.given or split_model(action)[1] is not None

    def _q_parts(self, action: str) -> tuple[str, str]:
        """(Q's model label, the cache action run on it) of a two-model action."""
        if action in self.given:
            return action, "full"
        cache, model = split_model(action)
        return parse_model(model, action).text, cache

    def generator(self, action: str) -> Generator:
        """Q's model of a two-model action (built on first use, then kept)."""
        label, _ = self._q_parts(action)
        if label not in self._generators:
            if action in self.given:
                built = given_generator(self.loaded, self.given[action], action)
            else:
                built = build_generator(self.loaded, parse_model(label, action),
                                        self.allow_download)
            self._generators[label] = built
        return self._generators[label]

    def _generator_pair(self, doc: Document, action: str) -> GeneratorPair:
        """P's full cache on P's model against the action's cache on Q's model."""
        label, cache = self._q_parts(action)
        generator = self.generator(action)
        if label not in self._q_factories:
            self._q_factories[label] = LMPairFactory(
                generator.loaded, self.chat_template, self.cache_fraction,
                presses=self.presses, eager=self.eager)
        q_factory = self._q_factories[label]
        full = self._full_pair()
        q_pair = q_factory(doc, cache)
        whole = parse_action(action) if action not in self.given else Action(name=action)
        return GeneratorPair(full, q_pair, whole, generator)

    def _full_pair(self) -> LMKernelPair:
        """P's side of a two-model pair: P's full cache of the current document (its shared
        reference prefill, with the question appended where the document has one)."""
        full = Action(name="full")
        if self._question_ids is not None:
            answered = self._answered_reference()
            return LMKernelPair(self.loaded.model, self._ids, full, reference=answered,
                                compressed=answered, question_after=True)
        if self._reference is None:
            self._prefill(None)
        return LMKernelPair(self.loaded.model, self._ids, full, reference=self._reference)

    def __call__(self, doc: Document, action: str) -> LMKernelPair | GeneratorPair:
        self._document(doc)
        if self._two_models(action):
            return self._generator_pair(doc, action)
        if action in self.presses:
            return self._general(doc, action)
        parsed = parse_action(action)
        if self._question_ids is not None:
            return self._after_context(parsed)
        shared = own_prefill_reason(parsed) is None
        if self._reference is None or (shared and parsed.name not in self._waiting):
            self._prefill(parsed if shared else None)
        compressed = self._waiting.pop(parsed.name, None)
        self._planned = [a for a in self._planned if a != parsed.name]
        if not shared:
            self.prefills += 1  # the pair runs the action's own prefill
        return LMKernelPair(self.loaded.model, self._ids, parsed, reference=self._reference,
                            compressed=compressed)

    def _after_context(self, parsed: Action) -> LMKernelPair:
        """A named action on a document with a question: the context's compression (shared
        by every question over it), then the question appended on both sides."""
        refusal = after_context_refusal(parsed)
        if refusal is not None:
            raise ValueError(refusal)
        shared = own_prefill_reason(parsed) is None
        if self._reference is None or (shared and parsed.name not in self._waiting):
            self._prefill(parsed if shared else None)
        context = self._waiting.get(parsed.name)  # kept for the next question
        if context is None:  # an action with its own prefill
            context = prefill(self.loaded.model, self._compressed_ids, parsed)
            self._waiting[parsed.name] = context
            self.prefills += 1
        reference = self._answered_reference()
        compressed = reference if context is self._reference else append_question(
            self.loaded.model, context, self._question_ids)
        return LMKernelPair(self.loaded.model, self._ids, parsed, reference=reference,
                            compressed=compressed, question_after=True)

    def _answered_reference(self) -> PromptCache:
        """P's cache of the context with this document's question appended (once per
        document)."""
        if self._reference is None:
            self._prefill(None)
        if self._answered is None:
            self._answered = append_question(self.loaded.model, self._reference,
                                             self._question_ids)
        return self._answered

    def _general(self, doc: Document, name: str) -> LMKernelPair:
        """The general path: P's shared full cache, Q's from a prefill inside the press (and
        the quantizer chained after it, ``mine+kivi:bits=4``)."""
        _ = self.identity  # the weights' digest, taken before any press runs (check_unit)
        self._before_press = ModelState.of(self.loaded.model)  # the rest of it (check_unit)
        if self._reference is None:
            self._prefill(None)
        quantization = chained_quantizer(name)
        general = self._general_caches.get(name)
        if general is None:
            general = press_prompt_cache(self.loaded.model, self._compressed_ids,
                                         self.presses[name], name, doc.id,
                                         eager=name in self.eager, quantization=quantization)
            self.prefills += 1
        action = Action(name=name, quantization=quantization)
        if self._question_ids is None:
            return LMKernelPair(self.loaded.model, self._ids, action,
                                reference=self._reference, general=general)
        if quantization is not None:
            raise ValueError(after_context_refusal(action))
        rule = None
        if general.rule is not None and not replays_over_question(general.rule):
            # refused before anything was written; kept as a guard
            raise ValueError(press_refusal(name, self.presses[name], f"document {doc.id!r}")
                             or f"action {name!r} compresses during decoding")
        self._general_caches[name] = general  # the next question over this context reuses it
        if general.rule is not None:  # the question is the press's first decoding step
            answered, rule = question_start(self.loaded.model, general.cache,
                                            self._question_ids, general.rule)
        else:
            answered = append_question(self.loaded.model, general.cache, self._question_ids)
        kv_bytes, kv_fraction = stored_memory(answered, self.loaded.model.config)
        return LMKernelPair(self.loaded.model, self._ids, action,
                            reference=self._answered_reference(),
                            general=PressCache(answered, rule, kv_bytes, kv_fraction),
                            question_after=True)

    def check_unit(self, doc: Document, action: str) -> None:
        """After a unit whose action is a press object: :class:`PressFailed` (the run stops,
        the unit is not stored) if the press changed the model's weights, which the unit's
        records and every later unit would silently be computed with (a ``score`` that writes
        ``o_proj.weight``, issue 52). The weights are digested again and held against the
        digest taken when the model loaded, which the records carry. The rest of the model
        (config, buffers, hooks, ...: :mod:`kvdrift.lm.model_state`), as it was before the
        unit's press ran, is put back and a change refused the same way (a decoding press's
        scorer runs during generation, after its prefill was checked)."""
        if self._two_models(action):  # a press on Q's model: Q's factory checks it
            label, cache = self._q_parts(action)
            if label in self._q_factories:
                self._q_factories[label].check_unit(doc, cache)
            return
        if action not in self.presses:
            return
        from kvdrift.lm.loading.digest import short, weights_digest

        before, self._before_press = self._before_press, None
        changes = () if before is None else before.changes()
        if changes:
            before.restore()
        loaded = self.identity.get("weights_sha256")
        now = weights_digest(self.loaded.model)
        press = self.presses[action]
        if loaded is not None and now != loaded:
            raise PressFailed(
                f"action {action!r} ({type(press).__qualname__}) changed the model's weights "
                f"on document {doc.id!r} (weights digest {short(loaded)} -> {short(now)}): a "
                f"press must leave the weights as it found them; this process's model now "
                f"holds other weights (load it again)")
        if changes:
            raise PressFailed(refusal(action, press, doc.id, changes))

    def put_back(self) -> None:
        """After a unit that raised: the model as it was before the unit's press ran (if one
        ran), and Q's model likewise, so that the caller gets back the model it named."""
        before, self._before_press = self._before_press, None
        if before is not None:
            before.restore()
        for factory in self._q_factories.values():
            factory.put_back()

    def _prefill(self, first: Action | None) -> None:
        """One forward: P's cache (if not yet computed), ``first``'s and as many planned
        actions' as fit :attr:`cache_fraction`."""
        n = int(self._compressed_ids.shape[-1])
        group = [first] if first is not None else []
        held = _held_fraction(first, n) if first is not None else 0.0
        for name in self._planned:
            action = parse_action(name)
            if (action.name in self._waiting or any(a.name == action.name for a in group)
                    or own_prefill_reason(action) is not None):
                continue
            more = _held_fraction(action, n)
            if held + more > self.cache_fraction:
                continue
            group.append(action)
            held += more
        result = prefill_shared(self.loaded.model, self._compressed_ids, group)
        self.prefills += 1
        if self._reference is None:
            self._reference = result.reference
        for name, cache in result.compressed.items():
            self._waiting[name] = cache


def chained_quantizer(name: str) -> Quantization | None:
    """The quantizer chained after a press object's name (``mine+kivi:bits=4``), or None."""
    head, plus, tail = name.rpartition("+")
    return parse_quantization(tail.strip(), name) if plus and is_quantization(tail.strip()) \
        else None


def _held_fraction(action: Action, n: int) -> float:
    """Kept entries of ``action``'s cache as a fraction of P's (1 where no single count)."""
    if action.prefill_is_noop(n) or action.head_adaptive:
        return 0.0  # P's tensors themselves (head-adaptive presses hide, not cut)
    try:
        return action.kept(n) / n
    except ValueError:
        return 1.0


@dataclass(frozen=True)
class LMPairSource:
    """A model to load and how: calling it loads the model and returns its pair factory."""

    model: str
    device: str = "auto"
    dtype: str = "float32"
    chat_template: bool = True
    allow_download: bool = False  # fetch a hub id that is not in the local cache
    presses: Mapping[str, object] | None = None  # action name -> press object (general path)
    eager: frozenset[str] = frozenset()  # press actions whose prefill runs eager attention
    # models handed over as Q by action name (in this process only)
    generators: Mapping[str, LoadedModel] | None = None

    def load(self) -> LoadedModel:
        return load_side_model(self.model, self.device, self.dtype,
                               allow_download=self.allow_download)

    def __call__(self) -> LMPairFactory:
        return LMPairFactory(self.load(), self.chat_template, presses=self.presses,
                             eager=self.eager, generators=self.generators,
                             allow_download=self.allow_download)


@dataclass(frozen=True)
class DriverSide:
    """What the driver holds for one model: its tokenizer, the builder of pair factories,
    and the model's context window when the driver loaded the model itself."""

    name: str
    tokenizer: Any
    build: Callable[[], LMPairFactory]
    context_window: int | None
    layers: int | None = None  # the model's layers (per-layer actions are checked against it)
    attention_window: int | None = None  # every layer's sliding window (Mistral v0.1), if any


def driver_side(
    source: LMPairSource, in_process: bool, load: Callable[[], LoadedModel] | None = None
) -> DriverSide:
    """What the driver needs for one model.

    An in-process executor shares the driver's model (``load()``, default ``source.load()``);
    any other gets ``source`` itself and loads the model in each worker, so the driver loads
    only the tokenizer and the config (for the context window that :func:`check_fits` checks
    before any unit runs).
    """
    if not in_process:
        config = text_config(source.model, source.allow_download)
        _refuse_sliding(config, source.model)
        return DriverSide(source.model, load_tokenizer(source.model, source.allow_download),
                          source, window_of(config), layers_of(config), _uniform_window(config))
    loaded = load() if load else source.load()
    config = loaded.model.config.get_text_config()
    _refuse_sliding(config, source.model)
    return DriverSide(source.model, loaded.tokenizer,
                      functools.partial(LMPairFactory, loaded, source.chat_template,
                                        presses=source.presses, eager=source.eager,
                                        generators=source.generators,
                                        allow_download=source.allow_download),
                      window_of(config), layers_of(config), _uniform_window(config))


def _uniform_window(config: Any) -> int | None:
    """The sliding window every layer applies where a config names one without per-layer
    types (Mistral v0.1: ``sliding_window`` 4096), else None."""
    window = getattr(config, "sliding_window", None)
    if getattr(config, "layer_types", None) or getattr(config, "use_sliding_window",
                                                       None) is False:
        return None
    return int(window) if isinstance(window, int) and window > 0 else None


def _refuse_sliding(config: Any, name: str) -> None:
    refusal = sliding_window_refusal(config, name)
    if refusal is not None:
        raise ValueError(refusal)


def check_actions_fit(actions: Sequence[str], side: DriverSide,
                      presses: Mapping[str, object] | None = None,
                      horizon: int | None = None,
                      prompts: Sequence[tuple[str, int]] = (),
                      estimator: object = "rollout") -> None:
    """Raise a one-line ValueError, naming the action and the fix, if an action cannot run on
    the model (per-layer ratios for another number of layers) or its press's own rules cannot
    hold (:mod:`~kvdrift.lm.engine.press_rules`: a decoding press's scorer window, a scorer
    decoding cannot feed, no compression within ``horizon``, a press object's window above
    the shortest of ``prompts`` ``(document id, prompt tokens)``; a decoding press kvdrift does
    not replay; a CAMPress under the ``estimator`` swrb, whose branches go back); meant to run
    before anything is written. Actions named in ``presses`` are press objects."""
    shortest = min(prompts, key=lambda p: p[1]) if prompts else None
    for name in actions:
        press = (presses or {}).get(name)
        if press is None:
            action = parse_action(name)
            if side.layers is not None:
                action.check_layers(side.layers)
            rule = None if action.decoding is None else stage_rule(action.decoding)
        else:
            rule = decoding_rule(press, name)
        if rule is not None:
            rule.for_prompt(shortest[1] if shortest else 0).check(name, horizon)
        if isinstance(rule, CamRule) and str(getattr(estimator, "name", estimator)) == "swrb":
            raise ValueError(f"action {name!r}: {SWRB_REFUSAL}")
        if press is not None:
            base = None if rule is None else getattr(rule.press, "base_press", None)
            # the decoding press, its scorer and the scorer an AdaKVPress wraps
            decoding = () if rule is None else (rule.press, base, getattr(base, "press", None))
            prefill = [p for p in nested_presses(press) if all(p is not d for d in decoding)]
            found = wrapped_problem(prefill) or (
                prompt_problem(prefill, *shortest) if shortest is not None else None)
            if found:
                raise ValueError(f"action {name!r}: {found}")


def check_generators_fit(actions: Sequence[str], p_model: str | LoadedModel,
                         allow_download: bool = False, device: str = "auto",
                         dtype: str = "float32") -> None:
    """Raise a one-line ValueError, before anything is written and before any weights load
    (P's model named: only its tokenizer and config are read), if an ``<action>@<model>``'s Q
    cannot run beside P: another checkpoint on another tokenizer, a weight type whose blocks
    do not fit P's layers (:func:`~kvdrift.lm.generators.build.check_spec_fits`)."""
    specs = {}
    for name in actions:
        _, model = split_model(name)
        if model is not None and model not in specs:
            specs[model] = name
    if not specs:
        return
    if isinstance(p_model, LoadedModel):
        tokenizer, config = p_model.tokenizer, p_model.model.config.get_text_config()
    else:
        tokenizer = load_tokenizer(p_model, allow_download)
        config = text_config(p_model, allow_download)
    for model, name in specs.items():
        try:
            check_spec_fits(parse_model(model, name), tokenizer, config, allow_download)
        except ValueError as exc:
            raise ValueError(f"action {name!r}: {exc}") from None
    if not isinstance(p_model, LoadedModel):  # P and every Q in memory at once
        check_models_fit_memory(p_model, [parse_model(m, n) for m, n in specs.items()], device,
                                dtype)


def check_questions_fit(documents: Sequence[Document], actions: Sequence[str],
                        presses: Mapping[str, object] | None = None) -> None:
    """Raise a one-line ValueError, before anything is written, if a document asks a question
    after its context and an action cannot be measured so (decode-time compression,
    quantization: :func:`~kvdrift.lm.engine.question.after_context_refusal`, and for a press
    object :func:`~kvdrift.lm.engine.question.press_refusal`). The study's settings are held
    so before torch loads where its documents are known then
    (:func:`kvdrift.preflight.check_questions`); this holds generated ones."""
    asking = next((doc for doc in documents if doc.question is not None), None)
    if asking is None:
        return
    document = f"document {asking.id!r}"
    for name in actions:
        if name in (presses or {}):
            refusal = press_refusal(name, (presses or {})[name], document) or \
                after_context_refusal(Action(name=name, quantization=chained_quantizer(name)),
                                      document)
        else:
            refusal = after_context_refusal(parse_action(name), document)
        if refusal is not None:
            raise ValueError(refusal)


class ContextWindowExceeded(ValueError):
    """A prompt plus the horizon does not fit in the model's context window (one line)."""


def check_fits(
    documents: Sequence[Document], horizon: int, side: DriverSide, chat_template: bool = True
) -> list[tuple[str, int]]:
    """Raise a clear error if a prompt plus ``horizon`` generated tokens exceeds the model's
    context window; meant to run before any unit so that no work is wasted. Returns each
    document's ``(id, prompt tokens)`` (for :func:`check_actions_fit`)."""
    window = side.context_window
    if window is not None and horizon >= window:  # no prompt fits at all
        raise ContextWindowExceeded(
            f"horizon H must be below {side.name}'s context window of {window} tokens, leaving "
            f"room for the prompt (allowed: H <= {window - 1} minus the longest prompt's "
            f"tokens); got {horizon}")
    prompts = []
    for doc in documents:
        if doc.question is None:
            n = int(encode_prompt(side.tokenizer, doc.prompt, chat_template).shape[-1])
        else:
            n = sum(int(part.shape[-1]) for part in encode_split(
                side.tokenizer, doc.prompt, doc.question, chat_template))
        prompts.append((doc.id, n))
        refusal = None if window is None else window_refusal(doc.id, n, horizon, side.name,
                                                             window)
        if refusal is not None:
            raise ContextWindowExceeded(refusal)
        sliding = side.attention_window
        if sliding is not None and n + horizon > sliding:
            raise ContextWindowExceeded(
                f"document {doc.id!r} has {n} prompt tokens; with H = {horizon} generated "
                f"positions that exceeds {side.name}'s sliding attention window of {sliding} "
                f"tokens: its layers attend only to their last {sliding} positions, which "
                f"kvdrift does not model (allowed: prompt tokens <= {sliding - horizon})")
    return prompts
