"""A stage's shape, known without kvpress: which budget each family takes (``ratio=``,
``budget=``, ``ratios=``, a decoding press's ``target=``), which fields each family and scorer
take, and how a field's text becomes its value. So ``decoding-knorm:interval=4,ratio=1e-17``,
``snapkv:ratio=0.5,budget=3`` or ``snapkv:ratio=0.5,foo=1`` is refused in one line before
torch, transformers and kvpress are imported.

The budget rules are stated here once: :meth:`kvdrift.lm.actions.presses.Family.check_budget`
and the early check (:func:`kvdrift.lm.grammar.values.check_action_values`) both ask
:func:`budget_problem`. The field names and kinds are a static copy of what
:mod:`kvdrift.lm.actions.presses` reads from the installed kvpress; a test compares the two.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

#: Each family's budget fields (exactly one is given); a decoding family's are checked by
#: :func:`decoding_problem` instead (:attr:`kvdrift.lm.actions.presses.Family.budgets`).
FAMILY_BUDGETS: dict[str, tuple[str, ...]] = {
    "": ("ratio", "budget"), "adakv": ("ratio", "budget"), "criticaladakv": ("ratio", "budget"),
    "criticalkv": ("ratio", "budget"), "block": ("ratio", "budget"),
    "rerotate": ("ratio", "budget"), "chunk": ("ratio",), "chunkkv": ("ratio",),
    "pyramidkv": ("ratio", "budget"), "perlayer": ("ratios",), "decoding": (),
    "decoding-adakv": (), "cam": ()}
#: Families that compress during decoding, and how (:func:`decoding_problem`).
DECODING_FAMILIES = {"decoding": "ratio or target", "decoding-adakv": "ratio or target",
                     "cam": "target"}

#: Scorers that read the layer's attention weights (eager attention, prefill only).
NEEDS_ATTENTION_WEIGHTS = ("ObservedAttentionPress",)
#: Wrapper presses that cannot take such a scorer, by kvpress class name, and why (kvpress
#: asserts; :data:`kvdrift.lm.actions.presses.REFUSES_ATTENTION_WEIGHTS`).
REFUSES_ATTENTION_WEIGHTS = {
    "AdaKVPress": "asserts the attention is not eager, and the scorer reads the eager "
                  "attention's weights",
    "CriticalAdaKVPress": "asserts the attention is not eager, and the scorer reads the eager "
                          "attention's weights",
    "BlockPress": "scores block by block and asserts it is given no attention weights",
    "ChunkPress": "scores chunk by chunk and asserts it is given no attention weights",
    "ChunkKVPress": "scores chunk by chunk and asserts it is given no attention weights"}
#: Each family's wrapper press that refuses them (:attr:`kvdrift.lm.actions.presses.Family.press`).
FAMILY_WRAPPERS = {"adakv": "AdaKVPress", "criticaladakv": "CriticalAdaKVPress",
                   "block": "BlockPress", "chunk": "ChunkPress", "chunkkv": "ChunkKVPress"}

# A field's kind, as the full parser reads its text (by the type of its kvpress default):
# "bool" (true/false), "int", "float" (a number, as a float) or "any" (None, text, none).
_I, _F, _B, _A = "int", "float", "bool", "any"
#: Each family's own fields (its wrapper press's), by spec name -> kind.
FAMILY_FIELDS: dict[str, dict[str, str]] = {
    "": {}, "adakv": {"alpha_safeguard": _F},
    "criticaladakv": {"alpha_safeguard": _F, "epsilon": _F, "first_stage_ratio": _F},
    "criticalkv": {"epsilon": _A, "first_stage_ratio": _A}, "block": {"block_size": _I},
    "rerotate": {}, "chunk": {"chunk_length": _I}, "chunkkv": {"chunk_length": _I},
    "pyramidkv": {}, "perlayer": {},
    "decoding": {"interval": _I, "target": _I, "buffer": _I},
    "decoding-adakv": {"interval": _I, "target": _I, "buffer": _I, "alpha_safeguard": _F},
    "cam": {"interval": _I, "target": _I, "buffer": _I, "merge": _I}}
#: Each scorer's fields (kvpress class name -> spec name -> kind; ``compression_ratio`` is set
#: by the budget), PyramidKV's included.
SCORER_FIELDS: dict[str, dict[str, str]] = {
    "CURPress": {"num_sinks": _I, "leverage_type": _A, "use_random_leverage": _B,
                 "use_local_approximation": _B, "local_window_size": _I},
    "CapPress": {"tau": _F, "n_future_positions": _I, "n_sink": _I, "epsilon": _F},
    "ExpectedAttentionPress": {"n_future_positions": _I, "n_sink": _I, "use_covariance": _B,
                               "use_vnorm": _B, "epsilon": _F},
    "KeyDiffPress": {}, "KnormPress": {},
    "LagKVPress": {"n_sink": _I, "lag_size": _I, "cross_scoring": _B},
    "LeverageScorePress": {"sketch_dimension": _I}, "NonCausalAttnPress": {"chunk_size": _I},
    "ObservedAttentionPress": {}, "RandomPress": {"seed": _A},
    "SnapKVPress": {"window_size": _I, "kernel_size": _I},
    "StreamingLLMPress": {"n_sink": _I}, "TOVAPress": {},
    "PyramidKVPress": {"window_size": _I, "kernel_size": _I, "beta": _I}}


def field_kind(default: Any) -> str:
    """How the full parser reads a field with kvpress default ``default`` (the kinds of
    :data:`SCORER_FIELDS`)."""
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    return "float" if isinstance(default, float) else "any"


def read_field(kind: str, key: str, text: str, label: str) -> Any:
    """A field's value from its text, by its ``kind`` (:func:`field_kind`); ValueError (one
    line) for text that is no value of that kind. ``none`` is None; an int is read before a
    float (and made a float for a float field)."""
    low = text.strip().lower()
    if kind == "bool":
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ValueError(f"{label} field {key!r} must be true or false; got {text!r}")
    if low == "none":
        return None
    for parse in (int, float):
        try:
            value = parse(text)
        except ValueError:
            continue
        return float(value) if kind == "float" else value
    if kind in ("int", "float"):
        raise ValueError(f"{label} field {key!r} must be a number; got {text!r}")
    return text.strip()


def removed_fraction(kept: float) -> float:
    """kvpress's ``compression_ratio`` (fraction removed) for a kept fraction, ``1 - kept``
    in exact decimal arithmetic (kept 0.7 -> 0.3, as a user writing the press would)."""
    return float(1 - Fraction(repr(kept)))


def budget_problem(family: str, label: str, given: list[str], ratio: Any = None,
                   target: bool = False) -> str | None:
    """Why the budget fields ``given`` (of ratio, budget, ratios) do not fit a stage of
    ``family`` named ``label`` (``ratio``: its value; ``target``: whether ``target=`` is
    given), or None."""
    if family in DECODING_FAMILIES:
        return decoding_problem(family, label, given, ratio, target)
    budgets = FAMILY_BUDGETS.get(family, ("ratio", "budget"))
    if len(given) != 1 or given[0] not in budgets:
        options = " or ".join(f"{w}=" for w in budgets)
        return (f"{label}: give exactly one of {options} (ratio: fraction of entries kept, in "
                f"(0, 1]; budget: entries kept, >= 1; ratios: one kept fraction per layer, "
                f"r_0/r_1/...)")
    return None


def decoding_problem(family: str, label: str, given: list[str], ratio: Any, target: bool
                     ) -> str | None:
    """:func:`budget_problem` for a family that compresses during decoding: ``target=``, or
    (not ``cam``) ``ratio=`` alone, whose fraction removed kvpress's
    ``CompressionRatioDecodingPress`` asserts is in [0, 1)."""
    if family == "cam":
        if given:
            return (f"{label}: CAMPress takes target= (entries kept per layer and KV head) and "
                    f"interval=, not {given[0]}=")
        if not target:
            return (f"{label}: give target=T (entries kept after each compression, >= 1) and "
                    f"interval=I (generated tokens between compressions)")
        return None
    if given == ["ratio"] and not target:
        in_range = isinstance(ratio, float) and 0 < ratio <= 1
        removed = removed_fraction(ratio) if in_range else 0.0
        if not 0 <= removed < 1:  # kvpress asserts 0 <= target_compression_ratio < 1
            return (f"{label}: ratio must be large enough that the fraction removed, 1 - ratio, "
                    f"stays below 1 in float64 (kvpress asserts it: ratio above about 5.6e-17, "
                    f"at most 1); got {ratio!r}")
        return None
    if given:
        return (f"{label}: a decoding press takes target= (entries kept per layer and KV head) "
                f"or ratio= (fraction of the tokens seen kept) and interval=, not {given[0]}=")
    if not target:
        return (f"{label}: give target=T (entries kept after each decoding-time compression, "
                f">= 1) or ratio=R (fraction of the tokens seen kept, in (0, 1]) and "
                f"interval=I (generated tokens between compressions)")
    return None


def weights_problem(wrapper: str | None, scorer: str, refusing: str | None = None
                    ) -> str | None:
    """Why the kvpress press class named ``wrapper`` cannot wrap the scorer class named
    ``scorer`` (one reading attention weights in a wrapper that refuses them), or None;
    ``refusing``: the class of :data:`REFUSES_ATTENTION_WEIGHTS` it subclasses, if not its
    own."""
    why = REFUSES_ATTENTION_WEIGHTS.get(refusing or wrapper or "")
    if why is None or scorer not in NEEDS_ATTENTION_WEIGHTS:
        return None
    return (f"kvpress's {wrapper} {why} ({scorer}); score with another scorer, or drop the "
            f"wrapper")
