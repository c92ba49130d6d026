"""The values an action spec gives, checked without torch or kvpress: budgets (``ratio=``,
``budget=``, ``ratios=``), the press fields whose rule needs no press class
(:data:`~kvdrift.lm.grammar.fields.FIELD_RULES`) and a quantization's settings (``kivi:bits=``,
``gguf:k=,v=``, ``fp8:``). So ``snapkv:ratio=2`` or ``kivi:bits=3`` is refused before the press
library loads. The full parser (:func:`kvdrift.lm.actions.spec.parse_action`) checks them again
with the rest (which fields a press takes, chaining rules); the quantization names below are a
static copy of :mod:`kvdrift.lm.quantized`'s, compared by a test.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvdrift import checks
from kvdrift.lm.grammar import stages
from kvdrift.lm.grammar.fields import ActionError, check_field, check_field_name, split_fields
from kvdrift.lm.grammar.model_spec import split_model
from kvdrift.lm.grammar.names import (
    KVPRESS_PRESSES,
    OWN_SCORER_FAMILIES,
    QUANTIZATIONS,
    split_prefix,
)
from kvdrift.lm.grammar.stages import (
    DECODING_FAMILIES,
    FAMILY_BUDGETS,
    FAMILY_FIELDS,
    SCORER_FIELDS,
    budget_problem,
    read_field,
)

#: Each offered scorer's kvpress class by short name (:data:`kvdrift.lm.actions.presses.SCORERS`).
SCORER_CLASS_NAMES = {
    "snapkv": "SnapKVPress", "knorm": "KnormPress", "streaming_llm": "StreamingLLMPress",
    "recent": "StreamingLLMPress", "tova": "TOVAPress",
    "expected_attention": "ExpectedAttentionPress", "observed_attention": "ObservedAttentionPress",
    "random": "RandomPress", "keydiff": "KeyDiffPress", "lagkv": "LagKVPress", "cur": "CURPress",
    "leverage": "LeverageScorePress", "non_causal_attn": "NonCausalAttnPress", "cap": "CapPress"}
#: KIVI's bit widths (:data:`kvdrift.lm.quantized.transform.KIVI_BITS`).
KIVI_BITS = (2, 4, 8)
#: llama.cpp cache types (:data:`kvdrift.lm.quantized.numerics.GGUF_TYPES`).
GGUF_TYPE_NAMES = ("f16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
#: fp8 formats (:data:`kvdrift.lm.quantized.numerics.FP8_FORMATS`).
FP8_FORMAT_NAMES = ("e4m3", "e5m2")


def _number(text: str) -> int | float | str:
    """A field's text as the number it reads as (int first), else the text itself."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            continue
    return text


def stage_label(head: str) -> str:
    """How the full parser names a stage written ``head`` (``[<family>-]<scorer>``) in its
    messages: ``SnapKVPress``, ``adakv-SnapKVPress``, ``pyramidkv-PyramidKVPress``."""
    text = head.strip()
    for family, own in OWN_SCORER_FAMILIES.items():
        if text.lower() == family or text == own:
            return f"{family}-{own}"
    family, scorer = split_prefix(text)
    if scorer not in KVPRESS_PRESSES:
        scorer = SCORER_CLASS_NAMES.get(scorer.strip().lower().replace("-", "_"), scorer)
    return f"{family}-{scorer}" if family else scorer


def _check_budgets(key: str, value: str, whole: str, label: str) -> bool:
    """Check a budget field (True), or say it is none (False); ``label``: the stage as the
    full parser names it, after the spec ``whole``."""
    what = {"ratio": "ratio (fraction of entries kept)", "budget": "budget (entries kept)"}
    try:
        if key == "ratio":
            checks.number(float(value), what[key], 0, 1, open_lo=True)
        elif key == "budget":
            checks.integer(int(value), what[key], 1)
        elif key == "ratios":
            for i, r in enumerate(value.split("/")):
                checks.number(float(r), f"ratios[{i}] (fraction kept in layer {i})", 0, 1,
                              open_lo=True)
        else:
            return False
    except ValueError as exc:
        if "must be" in str(exc):
            raise ActionError(f"action {whole!r}: {label}: {exc}") from None
        rule = {"ratio": "a number in (0, 1]", "budget": "an integer >= 1",
                "ratios": "numbers in (0, 1] joined by '/', e.g. 0.9/0.5"}[key]
        raise ActionError(f"action {whole!r}: {key} must be {rule}; got {value!r}") from None
    return True


def _scorer_name(head: str) -> str | None:
    """The kvpress class name of the scorer a stage written ``head`` scores with, or None."""
    text = head.strip()
    for family, own in OWN_SCORER_FAMILIES.items():
        if text.lower() == family or text == own:
            return own
    scorer = split_prefix(text)[1]
    if scorer in SCORER_FIELDS:
        return scorer
    return SCORER_CLASS_NAMES.get(scorer.strip().lower().replace("-", "_"))


def _stage_kinds(head: str) -> tuple[str, str, dict[str, str]] | None:
    """A stage written ``head``: its family, its scorer's class name and every field it takes
    -> kind (the family's first, as the full parser lists them), or None where the scorer is
    none kvdrift offers under that name (the full parser says why)."""
    text = head.strip()
    own = next((f for f, c in OWN_SCORER_FAMILIES.items() if text.lower() == f or text == c),
               None)
    family = own if own is not None else split_prefix(text)[0]
    scorer = _scorer_name(head)
    if scorer not in SCORER_FIELDS or family not in FAMILY_FIELDS:
        return None
    return family, scorer, {**FAMILY_FIELDS[family], **SCORER_FIELDS[scorer]}


def _check_pairing(family: str, scorer: str, label: str, whole: str) -> None:
    """A scorer that reads attention weights, under a wrapper that refuses them or in a
    press that compresses during decoding (whose steps return none)."""
    problem = stages.weights_problem(stages.FAMILY_WRAPPERS.get(family), scorer)
    if problem is not None:
        raise ActionError(f"action {whole!r}: {label}: {problem}")
    if family in DECODING_FAMILIES and scorer in stages.NEEDS_ATTENTION_WEIGHTS:
        raise ActionError(f"action {whole!r}: {scorer} needs attention weights, which "
                          f"decoding steps do not return")


def _check_press(part: str, whole: str) -> None:
    """One press stage, in the full parser's order: each field's text, the budget fields
    given, their values, then each other field's name and value."""
    head, _, tail = part.partition(":")
    label = stage_label(head)
    shape = _stage_kinds(head)
    fields = split_fields(tail, whole)
    budgets = [(k, v) for k, v in fields if k in ("ratio", "budget", "ratios")]
    others: list[tuple[str, object]] = []
    for key, text in fields:
        if key in ("compression_ratio", "compression_ratios"):
            raise ActionError(f"action {whole!r}: use ratio= (fraction kept) or budget= "
                              f"(entries kept), not {key}")
        if key in ("ratio", "budget", "ratios"):
            continue
        kind = shape[2].get(key, "any") if shape is not None else "any"
        try:
            others.append((key, read_field(kind, key, text, label)))
        except ValueError as exc:
            raise ActionError(f"action {whole!r}: {exc}") from None
    if shape is not None:
        ratio = next((v for k, v in budgets if k == "ratio"), None)
        problem = budget_problem(shape[0], label, [k for k, _ in budgets],
                                 _number(ratio) if ratio is not None else None,
                                 "target" in dict(fields))
        if problem is not None:
            raise ActionError(f"action {whole!r}: {problem}")
    for key, value in budgets:
        _check_budgets(key, value, whole, label)
    if shape is not None:
        _check_pairing(shape[0], shape[1], label, whole)
    for key, value in others:
        if shape is not None:
            try:
                check_field_name(label, key, FAMILY_BUDGETS[shape[0]], shape[2])
            except ActionError as exc:
                raise ActionError(f"action {whole!r}: {exc}") from None
        check_field(f"action {whole!r}: {label}", key, value)


def kivi_numbers(fields: Iterable[tuple[str, str]], whole: str) -> dict[str, int]:
    """A ``kivi:`` spec's ``bits``, ``group`` and ``residual`` fields as integers (``bits``
    required); ActionError for one that is not an integer."""
    numbers = {}
    for key, value in fields:
        if key in ("bits", "group", "residual"):
            try:
                numbers[key] = int(value)
            except ValueError:
                raise ActionError(f"action {whole!r}: kivi {key} must be an integer; got "
                                  f"{value!r}") from None
    if "bits" not in numbers:
        raise ActionError(f"action {whole!r}: kivi needs bits= (one of "
                          f"{', '.join(map(str, KIVI_BITS))})")
    return numbers


def _check_kivi(fields: list[tuple[str, str]], whole: str) -> None:
    numbers = kivi_numbers(fields, whole)
    try:
        checks.choice(numbers["bits"], "kivi bits", KIVI_BITS)
        group = checks.integer(numbers.get("group", 32), "kivi: group", 1)
    except ValueError as exc:
        raise ActionError(f"action {whole!r}: {exc}") from None
    residual = numbers.get("residual", 128)
    if residual < group or residual % group:
        raise ActionError(f"action {whole!r}: kivi: residual must be a positive multiple of "
                          f"group ({group}); got {residual}")


def _check_quantization(part: str, whole: str) -> None:
    head, _, tail = part.partition(":")
    kind = head.strip().lower()
    items = [i.strip() for i in tail.split(",") if i.strip()]
    try:
        if kind == "kivi":
            _check_kivi(split_fields(tail, whole), whole)
        elif kind == "gguf":
            for side, name in split_fields(tail, whole):
                if side in ("k", "v"):
                    checks.choice(name.lower(), f"llama.cpp cache type for {side}=",
                                  GGUF_TYPE_NAMES)
        else:
            formats = [i.lower() for i in items if "=" not in i]
            if len(formats) == 1:
                checks.choice(formats[0], "fp8 format", FP8_FORMAT_NAMES)
    except ActionError:
        raise
    except ValueError as exc:
        raise ActionError(f"action {whole!r}: {exc}") from None


def check_action_values(spec: object, defined: frozenset[str] | set[str] = frozenset()
                        ) -> None:
    """ActionError (one line naming the value and what is allowed) if ``spec`` gives a budget,
    a press field with a rule of its own or a quantization setting that no action takes;
    silent otherwise (the full parser sees the rest). ``defined``: the names of the user's
    own presses, which are not specs."""
    if not isinstance(spec, str) or ":" not in spec or spec.strip() in defined:
        return
    whole = spec.strip()
    parts = [p.strip() for p in split_model(whole)[0].split("+")]
    for i, part in enumerate(parts):
        head = part.partition(":")[0].strip()
        if head.lower() in QUANTIZATIONS:
            _check_quantization(part, whole)
        elif ":" in part:
            _check_press(part, whole)
            stage = _stage_kinds(head)
            if stage is not None and stage[0] in DECODING_FAMILIES and i < len(parts) - 1 \
                    and parts[i + 1].partition(":")[0].strip().lower() not in QUANTIZATIONS:
                raise ActionError(f"action {whole!r}: a decoding-* press must come last")
