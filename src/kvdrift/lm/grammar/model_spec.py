"""Which model Q runs on: the part of an action spec after ``@``, checked without torch.

An action says what is done to Q's cache; ``<action>@<model>`` also says which generator Q is,
so any two generators on one tokenizer can be compared (docs/two-models.md)::

    full@int4                  P's weights quantized as llama.cpp's Q4_0 (blocks of 32), full cache
    snapkv-half@int4           the same weights, and SnapKV keeping half the prompt
    full@q5_1                  any llama.cpp weight type the gguf package quantizes
    full@bfloat16              P's weights in bfloat16
    full@eager                 P's weights under transformers' eager attention
    full@./draft               another checkpoint (a folder or hub id) on P's tokenizer
    full@./draft+bfloat16      parts join with ``+``: that checkpoint, in bfloat16

A part is a weight type (``q8_0``, ``q5_1``, ``q5_0``, ``q4_1``, ``q4_0``, ``mxfp4``;
``int8`` and ``int4`` name ``q8_0`` and ``q4_0``), a dtype (``float32``, ``bfloat16``,
``float16``), an attention implementation (``sdpa``, ``eager``), or any other text: a model
name or path (taken before the other parts apply). Each kind at most once. P is the run's
model (``--model``, ``--dtype``), whose name may carry a part too (``smollm2@q8_0``:
:func:`split_p_model`); without ``@`` Q runs on P's model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvdrift import checks

MODEL_SEPARATOR = "@"
DTYPE_PARTS = ("float32", "bfloat16", "float16")
ATTENTION_PARTS = ("sdpa", "eager")
#: llama.cpp weight types the ``gguf`` package quantizes, with their bits per weight (scales
#: included), most bits first: the frontier's ``weights`` family walks them in this order.
WEIGHT_TYPES = {"q8_0": 8.5, "q5_1": 6.0, "q5_0": 5.5, "q4_1": 5.0, "q4_0": 4.5,
                "mxfp4": 4.25}
WEIGHT_ALIASES = {"int8": "q8_0", "int4": "q4_0"}
_WEIGHTS_LIKE = re.compile(r"(int|q|iq|tq|mxfp)\d+(_\w+)?\Z")  # a weight type misspelt


def model_rule() -> str:
    """What the part after ``@`` may be, as a refusal states it."""
    return (f"parts joined with '+', each one of a weight type "
            f"({', '.join([*WEIGHT_ALIASES, *WEIGHT_TYPES])}), a dtype "
            f"({', '.join(DTYPE_PARTS)}), an attention ({', '.join(ATTENTION_PARTS)}), or a "
            f"model name or path on P's tokenizer (e.g. full@int4, snapkv-half@q8_0, "
            f"full@bfloat16)")


@dataclass(frozen=True)
class ModelSpec:
    """Q's model: a checkpoint (None: P's own weights) in a dtype, under an attention
    implementation, with its linear layers' weights quantized as a llama.cpp ``weights``
    type (None: not)."""

    checkpoint: str | None = None
    dtype: str | None = None  # None: the checkpoint's as loaded (P's dtype)
    attention: str | None = None  # None: as P
    weights: str | None = None  # a key of WEIGHT_TYPES

    def __post_init__(self) -> None:
        if self.dtype is not None:
            checks.choice(self.dtype, "Q's dtype", DTYPE_PARTS)
        if self.attention is not None:
            checks.choice(self.attention, "Q's attention", ATTENTION_PARTS)
        if self.weights is not None:
            checks.choice(self.weights, "Q's weight type", WEIGHT_TYPES)
        if self.checkpoint is not None:
            checks.text(self.checkpoint, "Q's model name or path", visible=True)

    @property
    def text(self) -> str:
        """The canonical spec (what follows ``@``)."""
        parts = [self.checkpoint] if self.checkpoint else []
        return "+".join(parts + [p for p in (self.weights, self.dtype, self.attention) if p])

    def describe(self) -> str:
        """One line for ``run.json``, ``kvdrift actions`` and reports."""
        what = [f"checkpoint {self.checkpoint}" if self.checkpoint else "P's weights"]
        if self.weights is not None:
            what.append(f"linear weights as llama.cpp's {self.weights.upper()} "
                        f"({WEIGHT_TYPES[self.weights]} bits per weight, gguf's quantizer)")
        if self.dtype:
            what.append(f"in {self.dtype}")
        if self.attention:
            what.append(f"{self.attention} attention")
        return ", ".join(what)

    def as_record(self) -> dict[str, object]:
        """The settings a unit's fingerprint records (JSON-ready)."""
        return {"checkpoint": self.checkpoint, "dtype": self.dtype,
                "attention": self.attention, "weights": self.weights}


def split_model(spec: str) -> tuple[str, str | None]:
    """``"snapkv-half@int4"`` -> ``("snapkv-half", "int4")``; no ``@``: ``(spec, None)``."""
    head, at, tail = spec.partition(MODEL_SEPARATOR)
    return (head.strip(), tail.strip()) if at else (spec.strip(), None)


def parse_model_action(spec: str) -> tuple[str, ModelSpec | None]:
    """``"snapkv-half@int4"`` -> ``("snapkv-half", ModelSpec(weights="q4_0"))``, the cache
    action still to be parsed; one-line ValueError for a bad model part or no cache action."""
    head, model = split_model(spec)
    if model is None:
        return head, None
    if not head:
        raise ValueError(f"action {spec.strip()!r}: name what is done to Q's cache before '@' "
                         f"(full@{model} for Q's full cache)")
    return head, parse_model(model, spec.strip())


def parse_model(text: str, whole: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of the part after ``@``; a one-line ValueError naming the part
    and what is allowed otherwise (``whole``: the action spec, for the message)."""
    where = f"action {whole!r}: " if whole else ""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}the model after '@' must be {model_rule()}; got nothing")
    found: dict[str, object] = {}

    def once(kind: str, value: object, part: str) -> None:
        if kind in found:
            raise ValueError(f"{where}Q's model names its {kind} twice ({part!r}); give each "
                             f"kind of part once: {model_rule()}")
        found[kind] = value

    for part in (p.strip() for p in text.split("+")):
        if not part:
            raise ValueError(f"{where}an empty part in the model {text!r}; it must be "
                             f"{model_rule()}")
        name = part.lower()
        if name in DTYPE_PARTS:
            once("dtype", name, part)
        elif name in ATTENTION_PARTS:
            once("attention", name, part)
        elif name in WEIGHT_TYPES or name in WEIGHT_ALIASES:
            once("weights", WEIGHT_ALIASES.get(name, name), part)
        elif _WEIGHTS_LIKE.match(name):
            raise ValueError(f"{where}weight type must be one of "
                             f"{', '.join([*WEIGHT_ALIASES, *WEIGHT_TYPES])}; got {part!r}")
        else:
            once("checkpoint", part, part)
    return ModelSpec(checkpoint=found.get("checkpoint"), dtype=found.get("dtype"),
                     attention=found.get("attention"), weights=found.get("weights"))


def split_p_model(name: str) -> tuple[str, ModelSpec | None]:
    """P's model name with an ``@`` part (``smollm2@q8_0``: the embedded model, its weights
    as Q8_0) -> ``("smollm2", ModelSpec(weights="q8_0"))``; a one-line ValueError for a bad
    part or a checkpoint part (P's checkpoint is the name before ``@``)."""
    base, model = split_model(name)
    if model is None:
        return name, None
    if not base:
        raise ValueError(f"model {name!r}: name the model before '@' (e.g. smollm2@q8_0)")
    try:
        spec = parse_model(model, None)
    except ValueError as exc:
        raise ValueError(f"model {name!r}: {exc}") from None
    if spec.checkpoint is not None:
        raise ValueError(f"model {name!r}: P's checkpoint is the name before '@'; its '@' "
                         f"part takes a weight type, a dtype or an attention, not another "
                         f"model ({spec.checkpoint!r})")
    return base, spec
