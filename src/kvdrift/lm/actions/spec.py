"""Actions: the eviction policy Q applies, named by a short spec string.

An action is a chain of kvpress presses (:class:`~kvdrift.lm.actions.presses.Stage`) run at prefill,
optionally followed by one decoding-time press. kvpress expresses budgets as
``compression_ratio`` (the fraction *removed*, rounded by ``int(k_len * (1 - r))``); kvdrift's
``ratio`` is the fraction *kept* (``kept = floor(ratio * n)``) and ``budget`` a fixed count
(``kept = min(budget, n)``). The press is kvpress's own with ``compression_ratio = 1 - ratio``
(:meth:`Action.kvpress_call` prints it); where kvpress's float rounding would keep one entry
fewer, kvdrift departs on purpose and keeps ``floor(ratio * n)`` (each family names its
departures).

Named actions (docs/method.md section 1)::

    full          no eviction (same-path control)
    snapkv-half   SnapKV (window 64, kernel 5) keeping floor(n/2)
    snapkv-90     SnapKV keeping floor(9n/10)
    snapkv-512    SnapKV keeping min(512, n)
    recent-half   StreamingLLM (4 sinks + most recent) keeping floor(n/2)
    recent-90     StreamingLLM keeping floor(9n/10)

General form, one press: ``[<family>-]<scorer>:ratio=R|budget=B[,field=value...]``, e.g.
``knorm:ratio=0.5``, ``adakv-snapkv:ratio=0.5,alpha_safeguard=0.1``, ``pyramidkv:ratio=0.5``,
``perlayer-knorm:ratios=0.9/0.5``, ``decoding-knorm:interval=32,target=256``. Presses joined
with ``+`` run one after the other at prefill (kvpress's ``ComposedPress``); a final
``decoding-*`` press then compresses during generation (``PrefillDecodingPress``):
``snapkv:ratio=0.5+decoding-knorm:interval=32,target=256``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import kvpress

from kvdrift import checks
from kvdrift.lm.actions.presses import (
    FAMILIES,
    GENERAL_PATH,
    NOT_OFFERED,
    PLAIN,
    SCORERS,
    Family,
    Stage,
    allowed_scorers,
    family_names,
    family_table,
    field_defaults,
    not_a_spec,
    resolve_scorer,
    scorer_classes,
    wrapper_problem,
)
from kvdrift.lm.grammar.fields import ActionError, split_actions, split_fields
from kvdrift.lm.grammar.model_spec import (
    ModelSpec,
    model_rule,
    parse_model_action,
    split_model,
)
from kvdrift.lm.grammar.names import split_prefix
from kvdrift.lm.grammar.stages import field_kind, read_field
from kvdrift.lm.quantized.transform import (
    Quantization,
    is_quantization,
    parse_quantization,
    quantization_table,
)


@dataclass(frozen=True)
class _Named:
    spec: str | None  # the general form it stands for (None: no eviction)


NAMED_ACTIONS: dict[str, _Named] = {
    "full": _Named(None),
    "snapkv-half": _Named("snapkv:ratio=0.5"),
    "snapkv-90": _Named("snapkv:ratio=0.9"),
    "snapkv-512": _Named("snapkv:budget=512"),
    "recent-half": _Named("recent:ratio=0.5"),
    "recent-90": _Named("recent:ratio=0.9"),
}


@dataclass(frozen=True)
class Action:
    """A cache policy: prefill ``stages`` applied in order, then an optional ``decoding``
    stage that compresses every row's cache during generation, or an optional
    ``quantization`` of what is kept (:mod:`kvdrift.lm.quantized.transform`). None: ``full``.
    ``model``: the model Q runs on (``<action>@<model>``,
    :mod:`kvdrift.lm.grammar.model_spec`); None: P's own."""

    name: str
    stages: tuple[Stage, ...] = ()
    decoding: Stage | None = None
    quantization: Quantization | None = None
    model: ModelSpec | None = None

    def __post_init__(self) -> None:
        stages = tuple(self.stages)
        object.__setattr__(self, "stages", stages)
        if any(s.is_decoding for s in stages):
            raise ValueError(f"action {self.name!r}: a decoding-* press must come last")
        if self.decoding is not None and not self.decoding.is_decoding:
            raise ValueError(f"action {self.name!r}: decoding= takes a decoding-* press")
        for i, s in enumerate(stages if len(stages) > 1 else ()):
            if s.head_adaptive or (i < len(stages) - 1 and not s.uniform):
                raise ValueError(f"action {self.name!r}: {s.label} keeps counts that differ "
                                 f"per head, layer or prompt content; it cannot be chained with "
                                 f"'+' (only last, and never head-adaptive)")
        if self.quantization is not None and (self.decoding is not None or self.head_adaptive):
            raise ValueError(f"action {self.name!r}: a quantization can follow presses that "
                             f"keep one set of entries per KV head, not decoding-* or "
                             f"head-adaptive ones")
        for s in stages:
            problem = wrapper_problem(s.family.press, s.scorer)
            if problem:
                raise ValueError(f"action {self.name!r}: {s.label}: {problem}")
        if self.decoding is not None:
            if self.decoding.needs_attention_weights:
                raise ValueError(f"action {self.name!r}: {self.decoding.scorer_name} needs "
                                 f"attention weights, which decoding steps do not return")
            if any(s.head_adaptive for s in stages) and self.decoding.family.reorders:
                raise ValueError(f"action {self.name!r}: a head-adaptive press hides entries "
                                 f"per KV head by their positions in the cache, and the "
                                 f"{self.decoding.family.press_name}'s first compression "
                                 f"reorders and shortens that "
                                 f"cache, so kvpress then hides positions that hold other "
                                 f"entries or no longer exist; use a prefill press that "
                                 f"evicts, or decoding-adakv-<scorer>, which hides in place")

    def __str__(self) -> str:
        return self.name

    @property
    def cache_action(self) -> Action:
        """What is done to Q's cache, on Q's own model (this action without ``@<model>``)."""
        if self.model is None:
            return self
        return Action(name=split_model(self.name)[0], stages=self.stages,
                      decoding=self.decoding, quantization=self.quantization)

    @property
    def evicts_during_decoding(self) -> bool:
        return self.decoding is not None

    @property
    def head_adaptive(self) -> bool:
        return any(s.head_adaptive for s in self.stages)

    @property
    def needs_attention_weights(self) -> bool:
        """Whether a prefill press scores from attention weights (eager attention in prefill)."""
        return any(s.needs_attention_weights for s in self.stages)

    def stage_inputs(self, n_prompt: int) -> list[int]:
        """Entries each prefill stage sees (a chain's later stages see the earlier's kept)."""
        n = _check_n(n_prompt)
        inputs = []
        for i, s in enumerate(self.stages):
            inputs.append(n)
            if i < len(self.stages) - 1:  # only uniform stages come before another
                n = n if s.is_noop(n) else s.kept(n)
        return inputs

    def kept(self, n_prompt: int) -> int:
        """Prompt entries per KV head after prefill (on average over heads for head-adaptive
        presses); ValueError for presses without one count (perlayer, pyramidkv, chunkkv)."""
        n = _check_n(n_prompt)
        for s in self.stages:
            n = n if s.is_noop(n) else s.kept(n)
        return n

    def is_noop(self, n_prompt: int) -> bool:
        """Whether Q is P for this prompt length (nothing evicted or quantized, ever, on P's
        own model)."""
        if self.decoding is not None or self.quantization is not None or self.model is not None:
            return False
        return all(s.is_noop(m) for s, m in zip(self.stages, self.stage_inputs(n_prompt),
                                                 strict=True))

    def prefill_is_noop(self, n_prompt: int) -> bool:
        """Whether no prompt entry is evicted (or quantized) at prefill, on P's own model."""
        if self.quantization is not None or self.model is not None:
            return False
        return all(s.is_noop(m) for s, m in zip(self.stages, self.stage_inputs(n_prompt),
                                                 strict=True))

    def make_press(self, n_prompt: int) -> Any | None:
        """A fresh kvpress press for a prompt of ``n_prompt`` tokens, or None if a no-op.

        Prefill stages that evict nothing are left out; several remaining ones are chained
        with ``ComposedPress``; a decoding stage is joined with ``PrefillDecodingPress``.
        """
        if self.is_noop(n_prompt):
            return None
        if not self.stages and self.decoding is None:
            return None  # quantization alone: no press
        active = [s.build(m) for s, m in zip(self.stages, self.stage_inputs(n_prompt),
                                               strict=True) if not s.is_noop(m)]
        prefill = None if not active else active[0] if len(active) == 1 else \
            kvpress.ComposedPress(presses=active)
        if self.decoding is None:
            return prefill
        decoding = self.decoding.build(n_prompt)
        if prefill is None:
            return decoding
        return kvpress.PrefillDecodingPress(prefilling_press=prefill, decoding_press=decoding)

    def kvpress_call(self) -> str:
        """The kvpress press this action is, as the Python call that rebuilds it (kvpress's
        ``compression_ratio`` is the fraction removed: ``1 - ratio``); a quantization is
        kvdrift's own and is named after it."""
        calls = [s.kvpress_call() for s in self.stages]
        press = None if not calls else calls[0] if len(calls) == 1 else \
            f"ComposedPress(presses=[{', '.join(calls)}])"
        if self.decoding is not None:
            decoding = self.decoding.kvpress_call()
            press = decoding if press is None else \
                f"PrefillDecodingPress(prefilling_press={press}, decoding_press={decoding})"
        if self.quantization is not None:
            quantized = f"kvdrift's {self.quantization.label} quantization (no kvpress press)"
            press = quantized if press is None else f"{press}, then {quantized}"
        press = press or "no press (every entry kept)"
        return press if self.model is None else f"{press}, on Q's model: {self.model.describe()}"

    def departures(self) -> list[str]:
        """Where this action departs from its kvpress press on purpose, one line per family."""
        return list(dict.fromkeys(s.family.departs for s in (*self.stages, self.decoding)
                                  if s is not None and s.family.departs))

    def check_layers(self, n_layers: int) -> None:
        """Raise ValueError (one line) unless every stage fits a model of ``n_layers`` layers
        (per-layer ratios: one per layer)."""
        for stage in (*self.stages, *([self.decoding] if self.decoding else [])):
            stage.check_layers(n_layers)

    def check_counts(self, n_prompt: int, counts: Any, config: Any) -> None:
        """Raise RuntimeError unless ``counts`` ``[layers, kv_heads]`` (entries each KV head
        of each layer attends to after prefill) is what the action promises."""
        stages = [(s, m) for s, m in zip(self.stages, self.stage_inputs(n_prompt), strict=True)
                  if not s.is_noop(m)]
        if not stages:
            if bool((counts != n_prompt).any()):
                raise RuntimeError(f"action {self.name}: expected all {n_prompt} prompt entries, "
                                   f"got {counts.tolist()}")
            return
        last, m = stages[-1]
        try:
            last.check_counts(m, counts, config)
        except RuntimeError as exc:
            raise RuntimeError(f"action {self.name}: {exc}") from None


def _check_n(n_prompt: int) -> int:
    return checks.integer(n_prompt, "prompt length", 1)


def _coerce(fields: dict[str, Any], key: str, text: str, label: str) -> Any:
    """Parse a field value from text, guided by the default of the field it sets."""
    return read_field(field_kind(fields.get(key)), key, text, label)


_PREFIXES: dict[str, Family] = {f.name: f for f in FAMILIES.values() if f.wraps_scorers}


def _parse_head(head: str) -> tuple[Family, type]:
    """``[<family>-]<scorer>`` -> (family, kvpress scorer class)."""
    text = head.strip()
    for fam in FAMILIES.values():
        if fam.own_scorer is not None and (text.lower() == fam.name
                                           or text == fam.own_scorer.__name__):
            return fam, fam.own_scorer
    if not_a_spec(text):
        raise ValueError(not_a_spec(text))
    prefix, rest = split_prefix(text)
    if prefix:
        return _PREFIXES[prefix], resolve_scorer(rest)
    for fam in _PREFIXES.values():
        if fam.press_name == text:
            raise ValueError(f"{text} wraps a scorer: write {fam.name}-<scorer>:..., e.g. "
                             f"{fam.name}-snapkv:ratio=0.5")
    return PLAIN, resolve_scorer(text)


def _parse_stage(text: str, whole: str) -> Stage:
    if ":" not in text:
        raise checks.refuse(
            "action", f"one of {', '.join(NAMED_ACTIONS)}, or "
            f"[<family>-]<scorer>:ratio=R (fraction kept) / :budget=B (entries kept) with scorer "
            f"one of {allowed_scorers()} and family one of "
            f"{family_names()} (see `kvdrift run --actions help`)", text)
    head, _, tail = text.partition(":")
    family, scorer = _parse_head(head)
    label = family.label(scorer.__name__)
    defaults = field_defaults(family, scorer)
    values: dict[str, Any] = {}
    kwargs: list[tuple[str, Any]] = []
    for key, value in split_fields(tail, whole):
        if key == "ratio":
            try:
                values["ratio"] = float(value)
            except ValueError as exc:
                raise ValueError(f"action {whole!r}: ratio must be a number in (0, 1]; "
                                 f"got {value!r}") from exc
        elif key == "budget":
            try:
                values["budget"] = int(value)
            except ValueError as exc:
                raise ValueError(f"action {whole!r}: budget must be an integer >= 1; "
                                 f"got {value!r}") from exc
        elif key == "ratios":
            try:
                values["ratios"] = tuple(float(r) for r in value.split("/"))
            except ValueError as exc:
                raise ValueError(f"action {whole!r}: ratios must be numbers in (0, 1] joined "
                                 f"by '/', e.g. 0.9/0.5; got {value!r}") from exc
        elif key in ("compression_ratio", "compression_ratios"):
            raise ValueError(f"action {whole!r}: use ratio= (fraction kept) or budget= "
                             f"(entries kept), not {key}")
        else:  # a field the stage does not take is refused by Stage, naming those it takes
            try:
                kwargs.append((key, _coerce(defaults, key, value, label)))
            except ValueError as exc:
                raise ValueError(f"action {whole!r}: {exc}") from None
    try:
        return Stage(family=family, scorer=scorer, kwargs=tuple(kwargs), **values)
    except ValueError as exc:
        raise ActionError(f"action {whole!r}: {exc}") from None


def parse_action(spec: str | Action) -> Action:
    """Parse an action spec: a named action or ``+``-joined press specs (module docstring);
    :class:`ActionError` (a ValueError) with one line for a spec kvdrift cannot run."""
    if isinstance(spec, Action):
        return spec
    try:
        return _parse_action(spec)
    except ActionError:
        raise
    except ValueError as exc:
        raise ActionError(str(exc)) from None


def _parse_action(spec: str) -> Action:
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty action spec; named actions: {', '.join(NAMED_ACTIONS)}; "
                         f"or <press>:ratio=R / <press>:budget=B")
    text = spec.strip()
    if text == "help":
        raise ValueError("'help' is not an action; `kvdrift run --actions help` lists them")
    head, model = parse_model_action(text)
    if model is not None:  # <action>@<model>: the action on Q's own model
        try:
            cache = _parse_action(head)
        except ValueError as exc:  # named by the whole spec, as the user wrote it
            said = str(exc).removeprefix(f"action {head!r}: ")
            raise type(exc)(f"action {text!r}: {said}") from None
        return dataclasses.replace(cache, name=text, model=model)
    if text in NAMED_ACTIONS:
        named = NAMED_ACTIONS[text].spec
        if named is None:
            return Action(name=text)
        return Action(name=text, stages=(_parse_stage(named, text),))
    parts = [part.strip() for part in text.split("+")]
    quantization = None
    if is_quantization(parts[-1]):
        quantization = parse_quantization(parts.pop(), text)
    if any(is_quantization(part) for part in parts):
        raise ValueError(f"action {text!r}: a quantization (kivi:, gguf:, fp8:) must come "
                         f"last, after any eviction presses, e.g. snapkv:ratio=0.5+kivi:bits=4")
    stages = [_parse_stage(part, text) for part in parts]
    decoding = stages.pop() if stages and stages[-1].is_decoding else None
    try:
        return Action(name=text, stages=tuple(stages), decoding=decoding,
                      quantization=quantization)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def describe_actions(specs: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{spec: {"kvpress": the press as Python, "departs": [...]}}`` for ``run.json``."""
    out = {}
    for spec in specs:
        action = parse_action(spec)
        out[spec] = {"kvpress": action.kvpress_call(), "departs": action.departures()}
    return out


def actions_help() -> str:
    """The list of named actions, press families and scorers (``--actions help``)."""
    lines = ["Named actions:"]
    for name, named in NAMED_ACTIONS.items():
        lines.append(f"  {name:<14} {named.spec or 'no eviction (same-path control)'}")
        if named.spec:
            lines.append(f"  {'':<14} = {parse_action(name).kvpress_call()}")
    lines.append("")
    lines.append("Presses (r = ratio kept, n = prompt entries); join with '+' to chain:")
    for form, press, keeps, departs in family_table():
        lines.append(f"  {form}")
        lines.append(f"      {press}: {keeps}")
        if departs:
            lines.append(f"      departs from kvpress: {departs}")
    lines.append("")
    lines.append("Quantizations (last in a chain; bits per element with scales, head_dim 64):")
    for form, what, bits in quantization_table():
        lines.append(f"  {form:<42} {bits:>5} bits  {what}")
    lines.append("")
    lines.append("Q on another model: <action>@<model>, the model's parts joined with '+':")
    lines.append(f"  {model_rule()}")
    lines.append("  e.g. full@int4, snapkv-half@q8_0, full@bfloat16, full@eager, full@./my-draft")
    lines.append("")
    lines.append("Scorers: " + ", ".join(
        f"{short} ({cls})" for short, cls in SCORERS.items() if cls in scorer_classes()))
    lines.append("")
    lines.append("Every kvpress press class, and how kvdrift measures it (a spec's class also runs "
                 "as a press object, through the general path):")
    for press, how in press_classes():
        lines.append(f"  {press:<30} {how}")
    lines.append("")
    lines.append("General path (a press object given under an action name: --presses FILE, or "
                 "presses= from Python):")
    for press, what in GENERAL_PATH.items():
        lines.append(f"  {press}: {what}")
    lines.append("")
    lines.append("Not offered:")
    for press, why in NOT_OFFERED.items():
        lines.append(f"  {press}: {why}")
    return "\n".join(lines)


def press_classes() -> list[tuple[str, str]]:
    """(kvpress press class, how kvdrift measures it) for every class kvpress exports: the
    shared prefill (a spec names it), the general path (a press object) or not offered."""
    spec = {}
    for f in FAMILIES.values():  # a class two families build: the first names it
        if f.press is not None:
            spec.setdefault(f.press_name, f"shared prefill: {f.table_row()[0]}")
    spec |= {f.own_scorer.__name__: f"shared prefill: {f.table_row()[0]}"
             for f in FAMILIES.values() if f.own_scorer is not None}
    spec |= {cls: f"shared prefill: {form}"
             for f in FAMILIES.values() for cls, form in f.also_presses.items()}
    spec |= {cls: f"shared prefill: {short}:ratio=R | budget=B" for short, cls in
             reversed(SCORERS.items())}
    rows = []
    for name in sorted(n for n in dir(kvpress) if n.endswith("Press")):
        if name in spec:
            rows.append((name, spec[name]))
        elif name in NOT_OFFERED:
            rows.append((name, "not offered (see below)"))
        else:  # BasePress and ScorerPress: a user's own subclass, and any other class
            rows.append((name, "general path (a press object)"))
    return rows


__all__ = ["NAMED_ACTIONS", "Action", "ActionError", "Stage", "actions_help", "describe_actions",
           "parse_action", "split_actions"]
