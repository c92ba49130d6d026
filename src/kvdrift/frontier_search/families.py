"""Method families and their budget axes: a family at a budget is an action.

An eviction family (``snapkv``, ``recent``, ``pyramidkv``, ``adakv-snapkv``, ...) varies the
ratio kept on a fine grid of sixteenths; a quantization family (``kivi``, ``gguf``, ``fp8``)
walks its ladder of bits, cache types or formats; a chain (``snapkv+kivi:bits=4``) varies the
ratio of its eviction and keeps the rest; a family of the user's own presses (a function of the
ratio kept, :func:`user_family`) takes the eviction grid; a decoding-time family
(``decoding-knorm``, ``decoding-snapkv:interval=64``, ``cam-knorm:interval=64,merge=8``) walks
the entries a row keeps during generation (``target``, :data:`DECODING_TARGETS`), its other
fields kept as written. Budgets are ordered from the most cache to the least. A decoding press
over AdaKV (``decoding-adakv-<scorer>``) is no family: it hides entries but removes none, so
its budgets hold no less cache (its records carry no memory over the generation).

A decoding-time press leaves the prompt cache whole, so its memory is Q's whole cache averaged
over the generation (``kv_fraction_generation``, :mod:`kvdrift.records.generation`): a frontier
with a decoding family measures every family's budgets that way (:func:`memory_column`), so
that all sit on one axis; other frontiers keep the prompt cache (``kv_fraction``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kvdrift import checks
from kvdrift.llamacpp.cache_types import WEIGHT_QUANTS
from kvdrift.lm.grammar.model_spec import WEIGHT_TYPES
from kvdrift.lm.grammar.names import check_action_names
from kvdrift.records.schema import WEIGHTS_COLUMNS

#: The fine grid of ratios kept that an eviction family may be tried at (sixteenths).
RATIO_STEPS = 16
#: Discrete axes: kivi bits and llama.cpp cache types, most memory first.
KIVI_BITS = (8, 4, 2)
GGUF_TYPES = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
FP8_FORMATS = ("e5m2", "e4m3")
#: The entries per KV head a decoding family's row keeps (``target``), most memory first.
DECODING_TARGETS = (4096, 2048, 1024, 512, 256, 128, 64, 32)
#: The spec prefixes of the decoding-time presses a family may walk (``DecodingPress``,
#: ``CAMPress``), and the one refused (AdaKV under a ``DecodingPress``: nothing removed).
DECODING_PREFIXES = ("decoding-", "cam-")
HIDING_PREFIX = "decoding-adakv-"


@dataclass(frozen=True)
class Ladder:
    """A quantization family's discrete axis: each budget's label and action, most memory
    first."""

    labels: tuple[str, ...]
    actions: tuple[str, ...]


WEIGHTS_FAMILY = "weights"
"""The family of Q's models: P's weights as each llama.cpp weight type, most bits first
(``full@q8_0`` ... ``full@mxfp4``); its memory is Q's weights (``weights_fraction``)."""
GGUF_WEIGHTS_FAMILY = "gguf-weights"
"""The llama.cpp engine's family of Q's models: P's GGUF file requantized by llama.cpp to each
weight type, most bits first (``full@Q8_0`` ... ``full@Q2_K``); its memory is Q's file size
over P's (``weights_fraction``)."""
_BY_BITS = sorted(WEIGHT_QUANTS, key=lambda t: -WEIGHT_QUANTS[t])
#: The families whose memory is Q's weights (no cache family joins them).
WEIGHTS_FAMILIES = (WEIGHTS_FAMILY, GGUF_WEIGHTS_FAMILY)
#: The families the llama.cpp engine runs: its cache types and its weight quants.
LLAMA_FAMILIES = ("gguf", GGUF_WEIGHTS_FAMILY)
LADDERS: dict[str, Ladder] = {
    "kivi": Ladder(tuple(f"{b} bits" for b in KIVI_BITS),
                   tuple(f"kivi:bits={b}" for b in KIVI_BITS)),
    "gguf": Ladder(GGUF_TYPES, tuple(f"gguf:k={t},v={t}" for t in GGUF_TYPES)),
    "fp8": Ladder(FP8_FORMATS, tuple(f"fp8:{f}" for f in FP8_FORMATS)),
    WEIGHTS_FAMILY: Ladder(tuple(WEIGHT_TYPES), tuple(f"full@{t}" for t in WEIGHT_TYPES)),
    GGUF_WEIGHTS_FAMILY: Ladder(tuple(_BY_BITS), tuple(f"full@{t}" for t in _BY_BITS)),
}
"""The quantization families by name; any other family is an eviction (a ratio axis)."""


@dataclass(frozen=True)
class Budget:
    """One point of a family's axis: its position (0 = most cache) and the action spec."""

    family: str
    index: int
    label: str  # the axis value as the user reads it ("0.5", "4 bits", "q4_0")
    action: str  # the kvdrift action spec


@dataclass(frozen=True)
class Family:
    """A family's budgets, most cache first: the order the search tests them in."""

    name: str
    budgets: tuple[Budget, ...]

    def __post_init__(self) -> None:
        if not self.budgets:
            raise ValueError(f"family {self.name!r} has no budgets")


def _ratio_family(name: str, head: str, tail: str) -> Family:
    budgets = []
    for i, k in enumerate(range(RATIO_STEPS - 1, 0, -1)):
        ratio = Fraction(k, RATIO_STEPS)
        value = f"{float(ratio):g}"
        budgets.append(Budget(name, i, value, f"{head}:ratio={value}{tail}"))
    return Family(name, tuple(budgets))


def _decoding_family(name: str) -> Family:
    press, colon, fields = name.partition(":")
    if press.strip().lower().startswith(HIDING_PREFIX):
        raise ValueError(f"a decoding press over AdaKV hides entries but removes none (kvpress's "
                         f"cache never shrinks, so its records carry no memory over the "
                         f"generation), so a lower target holds no less cache and no frontier "
                         f"can rank it; measure its targets with `kvdrift run --actions`, or "
                         f"walk a press that removes entries ('decoding-knorm', "
                         f"'cam-knorm'); got {name!r}")
    if any(f.strip().startswith("target=") for f in fields.split(",")):
        raise ValueError(f"a decoding family names its press without target= (the frontier "
                         f"varies the entries kept): 'decoding-knorm', "
                         f"'decoding-knorm:interval=64', 'cam-knorm:merge=8'; got {name!r}")
    head = f"{press}:{fields}," if colon and fields.strip() else f"{press}:"
    return Family(name, tuple(Budget(name, i, str(t), f"{head}target={t}")
                              for i, t in enumerate(DECODING_TARGETS)))


def is_decoding(family: Family) -> bool:
    """Whether ``family`` compresses during generation (its axis is ``target``)."""
    return _decodes(family.name)


def _decodes(name: str) -> bool:
    """Whether a family named ``name`` is a decoding-time press (``decoding-``, ``cam-``)."""
    return name.strip().lower().startswith(DECODING_PREFIXES)


def memory_column(families: Sequence[Family]) -> str:
    """The replicate column a frontier of ``families`` measures memory by: Q's cache over the
    generation when any family compresses during it, Q's weights for the weights family (which
    no cache family joins), else Q's prompt cache (module docstring)."""
    weights = [f.name in WEIGHTS_FAMILIES for f in families]
    if any(weights):
        if not all(weights):
            raise ValueError("a weights family's memory is Q's weights and a "
                             "cache family's is Q's cache: one frontier ranks one memory; "
                             "search them in two frontiers")
        return WEIGHTS_COLUMNS[1]
    return "kv_fraction_generation" if any(is_decoding(f) for f in families) else "kv_fraction"


def check_engine_families(names: Sequence[str], engine: str) -> None:
    """One line if a family cannot run under ``engine``: the llama.cpp engine walks its cache
    types (``gguf``) and its weight quants (``gguf-weights``) only, which in turn need it."""
    for name in names:
        if engine == "llama.cpp" and name not in LLAMA_FAMILIES:
            raise ValueError(f"the llama.cpp engine walks the families {', '.join(LLAMA_FAMILIES)}"
                             f" (its cache types and weight quants); got {name!r}")
        if engine != "llama.cpp" and name == GGUF_WEIGHTS_FAMILY:
            raise ValueError(f"family {name!r} is llama.cpp's own quantizer: add --engine "
                             f"llama.cpp (or walk 'weights': the gguf package's types in torch)")


def user_family(name: str, make: Callable[[str, float], Any]) -> tuple[Family, dict[str, Any]]:
    """A family of the user's own (``FAMILIES`` of a presses file, :mod:`kvdrift.user_presses`)
    on the same grid of ratios kept as an eviction family, and each budget's press object by
    its action name (``<name>:ratio=<kept>``): ``make(name, kept)`` builds and checks it."""
    family = _ratio_family(name, name, "")
    return family, {b.action: make(name, float(b.label)) for b in family.budgets}


def _ladder_family(name: str, ladder: Ladder) -> Family:
    budgets = tuple(Budget(name, i, lab, act)
                    for i, (lab, act) in enumerate(zip(ladder.labels, ladder.actions,
                                                       strict=True)))
    return Family(name, budgets)


def split_families(text: str) -> tuple[str, ...]:
    """A comma list of families, a ``key=value`` piece continuing the family before it (as in
    ``--actions``): ``"snapkv,decoding-snapkv:interval=64,window_size=4"`` ->
    ``("snapkv", "decoding-snapkv:interval=64,window_size=4")``."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        head, eq, _ = part.partition("=")
        if out and eq and ":" not in head and "+" not in head:
            out[-1] = f"{out[-1]},{part}"
        else:
            out.append(part)
    return tuple(out)


def check_family_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` if they are one or more distinct family names; else one clear error."""
    return checks.distinct_items(names, "families", "one or more distinct family names")


def family_budgets(text: str) -> Family:
    """A family's budgets, its press names checked without kvpress (a typo is refused
    before the press library loads); :func:`parse_family` checks every budget's spec."""
    name = checks.text(text, "a family (a press or quantization name)", visible=True).strip()
    head, plus, rest = name.partition("+")
    tail = plus + rest
    if _decodes(head):
        if tail:
            raise ValueError(f"a decoding family compresses during generation and takes no "
                             f"'+' (a decoding press comes last); got {name!r}")
        fam = _decoding_family(name)
    elif head in LADDERS and not tail:
        fam = _ladder_family(name, LADDERS[head])
    elif ":" in head or head in LADDERS:
        raise ValueError(f"a family names its press without a budget (the frontier varies the "
                         f"budget): 'snapkv', 'kivi', 'snapkv+kivi:bits=4'; got {name!r}")
    else:
        fam = _ratio_family(name, head, tail)
    try:
        if name != GGUF_WEIGHTS_FAMILY:
            check_action_names(fam.budgets[0].action)
    except ValueError as exc:
        raise ValueError(f"family {name!r}: {exc}") from None
    return fam


def parse_family(text: str) -> Family:
    """``"snapkv"``, ``"kivi"``, ``"gguf"``, ``"fp8"``, ``"snapkv+kivi:bits=4"`` -> a family.

    An eviction head is any press that takes ``ratio`` (see ``kvdrift actions``); what follows
    its ``+`` is kept as written. The spec of every budget is checked by the action parser.
    """
    fam = family_budgets(text)
    name = fam.name
    if name == GGUF_WEIGHTS_FAMILY:  # the llama.cpp engine's actions
        from kvdrift.llamacpp.cache_types import check_llama_actions

        check_llama_actions([b.action for b in fam.budgets])
        return fam
    from kvdrift.lm.actions.spec import parse_action  # kvpress: imported once arguments are checked

    for budget in fam.budgets:  # a typo costs seconds, not a run
        try:
            parse_action(budget.action)
        except ValueError as exc:
            raise ValueError(f"family {name!r}: {exc}") from None
    return fam
