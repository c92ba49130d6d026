"""The llama.cpp engine's actions: llama.cpp's cache types and flash attention, checked without
importing llama.cpp.

    full                         f16 keys and values, flash attention on (P's cache)
    gguf:k=q8_0,v=q4_0           ``-ctk q8_0 -ctv q4_0`` (flash attention on)
    gguf:k=q8_0,v=f16,fa=off     ``-ctk q8_0 -ctv f16 -fa off``
    full@Q4_K_M                  P's GGUF file requantized by llama.cpp's quantizer, f16 cache
    gguf:k=q4_0,v=q4_0@./q.gguf  another GGUF file on P's vocabulary, with q4_0 caches

The ``gguf:`` names are those of kvdrift's torch emulation of the same cache types
(:mod:`kvdrift.lm.quantized.transform`), so one study's records under each engine compare
cell for cell. After ``@``: a GGUF file, or a llama.cpp weight type (:data:`WEIGHT_QUANTS`) that
P's file is requantized to (:mod:`~kvdrift.llamacpp.files`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdrift.lm.grammar.fields import split_fields

#: llama.cpp's KV-cache types (``-ctk``/``-ctv``) with their bits per element, scales included.
CACHE_TYPES = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q5_1": 6.0, "q5_0": 5.5,
               "q4_1": 5.0, "iq4_nl": 4.5, "q4_0": 4.5}
#: llama.cpp weight types its quantizer writes without an importance matrix, with their
#: approximate bits per weight, most bits first (a frontier family walks them in this order).
WEIGHT_QUANTS = {"Q8_0": 8.5, "Q6_K": 6.56, "Q5_K_M": 5.7, "Q5_1": 6.0, "Q5_K_S": 5.5,
                 "Q5_0": 5.5, "Q4_K_M": 4.85, "Q4_1": 5.0, "Q4_K_S": 4.58, "Q4_0": 4.5,
                 "IQ4_NL": 4.5, "IQ4_XS": 4.25, "Q3_K_L": 4.27, "Q3_K_M": 3.91,
                 "Q3_K_S": 3.5, "Q2_K": 2.96}
#: ggml's type ids of the cache types (``enum ggml_type``; the binding names some, not bf16).
GGML_TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
                 "iq4_nl": 20, "bf16": 30}
FULL = "full"
BLOCKED = {"q8_0", "q5_1", "q5_0", "q4_1", "iq4_nl", "q4_0"}  # blocks of 32 along head_dim
ON_OFF = {"on": True, "off": False}


def rule() -> str:
    """What an action of the llama.cpp engine may be, as a refusal states it."""
    return (f"'full' or 'gguf:k=TYPE,v=TYPE[,fa=on|off]' with TYPE one of "
            f"{', '.join(CACHE_TYPES)}, optionally followed by '@' and a GGUF file or a "
            f"llama.cpp weight type ({', '.join(WEIGHT_QUANTS)})")


@dataclass(frozen=True)
class LlamaAction:
    """Q in llama.cpp: its cache types, flash attention, and its model (None: P's file)."""

    name: str
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attention: bool = True
    model: str | None = None  # a GGUF file, or a key of WEIGHT_QUANTS

    @property
    def quantized_weights(self) -> str | None:
        """The llama.cpp weight type Q's file is requantized to, if the model part names one."""
        if self.model is None:
            return None
        upper = self.model.upper()
        return upper if upper in WEIGHT_QUANTS else None

    @property
    def cache_bits(self) -> tuple[float, float]:
        """Bits per key and per value element in Q's cache (scales included)."""
        return CACHE_TYPES[self.type_k], CACHE_TYPES[self.type_v]


def parse_llama_action(spec: str) -> LlamaAction:
    """The :class:`LlamaAction` of an action name; a one-line ValueError naming the name and
    what is allowed otherwise."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a llama.cpp action must be {rule()}; got {spec!r}")
    name = spec.strip()
    head, at, model = name.partition("@")
    head, model = head.strip(), model.strip() if at else None
    if at and not model:
        raise ValueError(f"action {name!r}: name a GGUF file or a llama.cpp weight type after "
                         f"'@' ({', '.join(WEIGHT_QUANTS)})")
    if model is not None and model.upper() not in WEIGHT_QUANTS and \
            not model.lower().endswith(".gguf"):
        raise ValueError(f"action {name!r}: the model after '@' must be a .gguf file or a "
                         f"llama.cpp weight type ({', '.join(WEIGHT_QUANTS)}); got {model!r}")
    if head == FULL:
        return LlamaAction(name=name, model=model)
    kind, colon, body = head.partition(":")
    if kind.strip() != "gguf" or not colon:
        raise ValueError(f"action {name!r} is not a llama.cpp action; allowed: {rule()}")
    try:
        fields = dict(split_fields(body, name))
    except ValueError as exc:
        raise ValueError(f"{exc}; allowed: {rule()}") from None
    unknown = sorted(set(fields) - {"k", "v", "fa"})
    if unknown:
        raise ValueError(f"action {name!r}: unknown field {unknown[0]!r}; allowed: {rule()}")
    types = {}
    for side in ("k", "v"):
        value = fields.get(side, "f16").strip().lower()
        if value not in CACHE_TYPES:
            raise ValueError(f"action {name!r}: {side}={value!r} is not a llama.cpp cache type; "
                             f"allowed: {', '.join(CACHE_TYPES)}")
        types[side] = value
    fa = fields.get("fa", "on").strip().lower()
    if fa not in ON_OFF:
        raise ValueError(f"action {name!r}: fa={fa!r}; allowed: on, off")
    if not ON_OFF[fa] and types["v"] not in ("f32", "f16", "bf16"):
        raise ValueError(f"action {name!r}: llama.cpp stores a quantized V cache "
                         f"(v={types['v']}) only with flash attention; use fa=on or a v type "
                         f"of f16, bf16 or f32")
    return LlamaAction(name=name, type_k=types["k"], type_v=types["v"],
                       flash_attention=ON_OFF[fa], model=model)


def check_llama_actions(actions: list[str] | tuple[str, ...]) -> list[LlamaAction]:
    """Every action parsed (one-line ValueError at the first bad one)."""
    return [parse_llama_action(a) for a in actions]


def describe_llama_actions(specs: list[str] | tuple[str, ...]) -> dict[str, dict[str, str]]:
    """``{spec: {"llama.cpp": its flags}}`` for ``run.json`` (what each action ran as)."""
    out = {}
    for spec in specs:
        a = parse_llama_action(spec)
        flags = f"-ctk {a.type_k} -ctv {a.type_v} -fa {'on' if a.flash_attention else 'off'}"
        if a.quantized_weights is not None:
            flags += f"; Q: P's file requantized to {a.quantized_weights} by llama.cpp"
        elif a.model is not None:
            flags += f"; Q: {a.model}"
        out[spec] = {"llama.cpp": flags}
    return out
