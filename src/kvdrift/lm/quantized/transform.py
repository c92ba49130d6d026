"""Quantization actions: a transform of Q's prompt cache and of Q's generated entries.

An action may end with one quantization (alone, or after eviction presses joined with ``+``:
``snapkv:ratio=0.5+kivi:bits=4`` evicts, then quantizes what is kept). Attention reads the
dequantized values (the numerics of :mod:`kvdrift.lm.quantized.numerics`), which is what a quantized
cache's attention sees.

``gguf:k=TYPE,v=TYPE`` -- llama.cpp's ``-ctk/-ctv`` cache types (f16, q8_0, q5_1, q5_0, q4_1,
q4_0): every key and value entry is quantized per token, in blocks of 32 along head_dim, as it
enters the cache. As in llama.cpp the prompt is written into the cache before the prefill's
attention reads it, so Q runs its own prefill forward whose attention reads quantized entries
(the first generated position can differ: ``delta_1 > 0``), and an eviction press before it
scores quantized keys. Generated entries are quantized the same way, the new token's included.

``kivi:bits=2|4|8[,group=32][,residual=128]`` -- KIVI (Liu et al. 2024): keys per channel in
groups of ``group`` tokens, values per token in groups of ``group`` channels, asymmetric
min-max. As in KIVI the prefill attends in full precision (Q reuses P's prefill forward, and
``delta_1 = 0``); then, for a prompt of ``k`` kept entries (per layer and KV head), the first
``k - k mod residual`` keys and the first ``k - residual`` values are quantized and the rest
stay in full precision. kvdrift shares a side's prompt cache between every row, so those prompt
entries stay as they are; each row's generated tokens then follow KIVI's streaming rule among
themselves: at a decoding step with ``L`` generated tokens before the new one, generated keys
``j < residual * floor(L / residual)`` are quantized (whole blocks of ``residual`` tokens,
groups of ``group`` generated tokens from the first), generated values ``j < L - residual``
are quantized, the new token and the rest are full precision (KIVI quantizes after the
step's attention). KIVI itself lets the prompt's full-precision tail join the first generated
block; kvdrift does not, because the prompt is shared. A row's view depends only on its own
entries and length, so truncation (SWRB) and other rows never change it.

``fp8:e4m3|e5m2[,scale=S]`` -- the fp8 caches of vLLM and SGLang (``--kv-cache-dtype
fp8``, ``fp8_e4m3``, ``fp8_e5m2``): every key and value entry divided by a per-tensor scale,
stored as fp8 and multiplied back (:func:`~kvdrift.lm.quantized.numerics.fp8_roundtrip`). The
scale is one number for every layer, keys and values alike: 1 by default, what the engines use when
the checkpoint carries no calibrated scales (kvdrift does not calibrate per-layer scales from
the prompt). As in vLLM's FlashAttention backend, whose prefill attention reads K and V
from the cache it has just written, entries are quantized as they enter, before the
prefill's attention reads them (the gguf timing: ``delta_1 > 0`` is possible; a press before
it scores quantized keys). A prefill kernel that attends to the new entries before they are
stored (a ragged prefill) would give ``delta_1 = 0`` instead; kvdrift does not model it.

Each kind is a small frozen class (:data:`QUANTIZATIONS`): its fields, spec parsing, label,
bits and bytes, and its transforms of prompt and generated entries.

Sizes (``kv_bytes``) count Q's prompt cache: quantized entries at their bits, one float16
scale (and for asymmetric types one float16 minimum) per group, full-precision entries at
the model's dtype; fp8 entries take one byte each, plus a float32 key and value scale per
layer (8 bytes), as vLLM stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from transformers import DynamicCache

from kvdrift import checks
from kvdrift.lm.grammar.fields import split_fields
from kvdrift.lm.grammar.values import KIVI_BITS, kivi_numbers
from kvdrift.lm.quantized.numerics import (
    FP8_FORMATS,
    GGUF_BLOCK,
    GGUF_TYPES,
    fp8_roundtrip,
    gguf_roundtrip,
    minmax_dequantized,
    minmax_roundtrip,
)

SCALE_BITS = 16  # KIVI's and llama.cpp's scales and minima are float16
FP8_SCALE_BYTES = 4  # vLLM: one float32 k_scale and one v_scale per attention layer


@dataclass(frozen=True)
class Quantization:
    """A cache quantization kind (subclasses: :class:`KIVIQuantization`,
    :class:`GGUFQuantization`, :class:`FP8Quantization`)."""

    kind: ClassVar[str] = ""
    before_attention: ClassVar[bool] = False
    """Whether entries are quantized before the prefill's attention reads them."""
    layer_bytes: ClassVar[int] = 0  # bytes per layer held beside the entries (scales)

    @property
    def label(self) -> str:
        raise NotImplementedError

    @classmethod
    def from_items(cls, items: list[str], whole: str) -> Quantization:
        """The kind from its spec's comma items (``key=value``)."""
        values = _key_values(cls.kind, items, tuple(f.name for f in fields(cls)), whole)
        return cls._build(values, whole)

    @classmethod
    def _build(cls, values: dict[str, str], whole: str) -> Quantization:
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"action {whole!r}: {exc}") from None

    def check(self, head_dim: int) -> None:
        """ValueError unless the kind's groups divide the model's ``head_dim``."""

    def bits_per_element(self, head_dim: int = 64) -> tuple[float, float]:
        """Bits per key and per value element of quantized entries, scales included."""
        raise NotImplementedError

    def entry_bytes(self, kept: int, head_dim: int, dtype_bytes: int) -> float:
        """Bytes of one KV head's prompt entries (keys and values) for ``kept`` entries."""
        kbits, vbits = self.bits_per_element(head_dim)
        return kept * head_dim * (kbits + vbits) / 8

    def entering(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Entries as a per-entry kind stores them (``before_attention`` kinds)."""
        raise NotImplementedError

    def prompt(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One layer's prompt entries ``[1, kv_heads, k, head_dim]`` after quantization
        (new tensors; ``before_attention`` kinds: already quantized by their prefill)."""
        return self.entering(keys, values)

    def generated(self, keys: torch.Tensor, values: torch.Tensor, steps: torch.Tensor,
                  valid: torch.Tensor, before: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What attention reads of the rows' generated entries (module docstring).

        keys, values: ``[n, kv_heads, G, head_dim]`` full precision; steps: ``[n, G]``
        generated index held by each slot; valid: ``[n, G]`` bool, slots the row attends to;
        before: ``[n]`` generated tokens before the new one. Rows never mix.
        """
        return self.entering(keys, values)


def _key_values(kind: str, items: list[str], allowed: tuple[str, ...],
                whole: str) -> dict[str, str]:
    values = dict(split_fields(",".join(items), whole))
    for key in values:
        checks.choice(key, f"action {whole!r}: {kind} field", allowed)
    return values


@dataclass(frozen=True)
class KIVIQuantization(Quantization):
    """KIVI: ``bits`` per element, groups of ``group``, the last ``residual`` full precision."""

    bits: int = 2
    group: int = 32
    residual: int = 128
    kind: ClassVar[str] = "kivi"

    def __post_init__(self) -> None:
        checks.choice(self.bits, "kivi bits", KIVI_BITS)
        checks.integer(self.group, "kivi: group", 1)
        if self.residual < self.group or self.residual % self.group:
            raise ValueError(f"kivi: residual must be a positive multiple of group "
                             f"({self.group}); got {self.residual}")

    @classmethod
    def _build(cls, values: dict[str, str], whole: str) -> Quantization:
        return super()._build(kivi_numbers(values.items(), whole), whole)

    @property
    def label(self) -> str:
        return f"kivi:bits={self.bits},group={self.group},residual={self.residual}"

    def check(self, head_dim: int) -> None:
        if head_dim % self.group:
            raise ValueError(f"kivi: group ({self.group}) must divide the model's head_dim "
                             f"({head_dim}); allowed groups: divisors of {head_dim}")

    def bits_per_element(self, head_dim: int = 64) -> tuple[float, float]:
        extra = 2 * SCALE_BITS / self.group  # scale and minimum per group
        return self.bits + extra, self.bits + extra

    def entry_bytes(self, kept: int, head_dim: int, dtype_bytes: int) -> float:
        kbits, vbits = self.bits_per_element(head_dim)
        kq = kept - kept % self.residual
        vq = max(0, kept - self.residual)
        full = (kept - kq) + (kept - vq)
        return head_dim * (kq * kbits + vq * vbits) / 8 + full * head_dim * dtype_bytes

    def prompt(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        k = keys.shape[2]
        kq = k - k % self.residual
        vq = max(0, k - self.residual)
        keys, values = keys.clone(), values.clone()
        if kq:
            keys[:, :, :kq] = minmax_roundtrip(keys[:, :, :kq], self.bits, self.group, dim=2)
        if vq:
            values[:, :, :vq] = minmax_roundtrip(values[:, :, :vq], self.bits, self.group, dim=3)
        return keys, values

    def generated(self, keys: torch.Tensor, values: torch.Tensor, steps: torch.Tensor,
                  valid: torch.Tensor, before: torch.Tensor) -> tuple[torch.Tensor, ...]:
        r = self.residual
        k_quant = valid & (steps < (before // r * r)[:, None])  # [n, G]
        v_quant = valid & (steps < (before - r)[:, None])
        if bool(k_quant.any()):
            keys = _grouped_keys(keys, k_quant, steps, self.bits, self.group)
        if bool(v_quant.any()):
            per_token = minmax_roundtrip(values, self.bits, self.group, dim=3)
            values = torch.where(v_quant[:, None, :, None], per_token, values)
        return keys, values


@dataclass(frozen=True)
class GGUFQuantization(Quantization):
    """llama.cpp cache types ``k`` and ``v`` (names in :data:`GGUF_TYPES`)."""

    k: str = "f16"
    v: str = "f16"
    kind: ClassVar[str] = "gguf"
    before_attention: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for side, name in (("k", self.k), ("v", self.v)):
            checks.choice(name, f"llama.cpp cache type for {side}=", GGUF_TYPES)

    @classmethod
    def _build(cls, values: dict[str, str], whole: str) -> Quantization:
        if set(values) != {"k", "v"}:
            raise ValueError(f"action {whole!r}: gguf needs k=TYPE,v=TYPE with TYPE one of "
                             f"{', '.join(GGUF_TYPES)}")
        return super()._build({k: v.lower() for k, v in values.items()}, whole)

    @property
    def label(self) -> str:
        return f"gguf:k={self.k},v={self.v}"

    def check(self, head_dim: int) -> None:
        if head_dim % GGUF_BLOCK:
            raise ValueError(f"gguf: the block of 32 ({GGUF_BLOCK}) must divide the model's "
                             f"head_dim ({head_dim}); allowed groups: divisors of {head_dim}")

    def bits_per_element(self, head_dim: int = 64) -> tuple[float, float]:
        return GGUF_TYPES[self.k].bits, GGUF_TYPES[self.v].bits

    def entering(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return gguf_roundtrip(keys, self.k), gguf_roundtrip(values, self.v)


@dataclass(frozen=True)
class FP8Quantization(Quantization):
    """An fp8 cache: ``format`` ``e4m3`` or ``e5m2``, one per-tensor ``scale`` (default 1)."""

    format: str = "e4m3"
    scale: float = 1.0
    kind: ClassVar[str] = "fp8"
    before_attention: ClassVar[bool] = True
    layer_bytes: ClassVar[int] = 2 * FP8_SCALE_BYTES

    def __post_init__(self) -> None:
        checks.choice(self.format, "fp8 format", FP8_FORMATS)
        checks.number(self.scale, "fp8: scale", 0, open_lo=True)

    @classmethod
    def from_items(cls, items: list[str], whole: str) -> Quantization:
        formats = [i.strip().lower() for i in items if "=" not in i]
        if len(formats) != 1:
            raise ValueError(f"action {whole!r}: fp8 needs one format, "
                             f"{' or '.join(FP8_FORMATS)} (fp8:e4m3[,scale=S])")
        values = _key_values("fp8", [i for i in items if "=" in i], ("scale",), whole)
        scale = 1.0
        if "scale" in values:
            try:
                scale = float(values["scale"])
            except ValueError:
                raise ValueError(f"action {whole!r}: fp8 scale must be a number; got "
                                 f"{values['scale']!r}") from None
        return cls._build({"format": formats[0], "scale": scale}, whole)

    @property
    def label(self) -> str:
        return f"fp8:{self.format}" + (f",scale={self.scale:g}" if self.scale != 1 else "")

    def bits_per_element(self, head_dim: int = 64) -> tuple[float, float]:
        return 8.0, 8.0

    def entering(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (fp8_roundtrip(keys, self.format, self.scale),
                fp8_roundtrip(values, self.format, self.scale))


QUANTIZATIONS: dict[str, type[Quantization]] = {
    q.kind: q for q in (KIVIQuantization, GGUFQuantization, FP8Quantization)}


def _grouped_keys(keys: torch.Tensor, quant: torch.Tensor, steps: torch.Tensor, bits: int,
                  group: int) -> torch.Tensor:
    """Keys of the ``quant`` slots quantized per channel in groups of ``group`` generated
    indices (slots may hold holes and be out of order: groups follow ``steps``)."""
    n_groups = int(steps[quant].max()) // group + 1
    gid = torch.where(quant, steps // group, n_groups)  # unquantized slots: a spare group
    idx = gid[:, None, :, None].expand_as(keys)  # [n, kv, G, d]
    shape = (*keys.shape[:2], n_groups + 1, keys.shape[3])
    lo = keys.new_full(shape, float("inf")).scatter_reduce(2, idx, keys, "amin")
    hi = keys.new_full(shape, float("-inf")).scatter_reduce(2, idx, keys, "amax")
    out = minmax_dequantized(keys, lo.gather(2, idx), hi.gather(2, idx), bits)
    return torch.where(quant[:, None, :, None], out, keys)


@dataclass(frozen=True)
class GeneratedView:
    """What a Q row's attention reads of its generated entries: handed to the shared-prompt
    attention as ``kvdrift_quant=`` (slots as in the cache, the new one last)."""

    quantization: Quantization
    steps: torch.Tensor  # [n, G] long: generated index held by each slot
    valid: torch.Tensor  # [n, G] bool: slots the row attends to
    before: torch.Tensor  # [n] long: generated tokens before the new one

    def __call__(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.quantization.generated(keys, values, self.steps, self.valid, self.before)


def kv_memory(keys: tuple[torch.Tensor, ...], live: Any, n_prompt: int,
              quantization: Quantization | None) -> tuple[float, float]:
    """``(kv_bytes, kv_fraction)`` of a side's prompt cache: bytes its kept entries hold
    (quantized at their bits, scales included; else the cache's dtype) and their fraction of
    the full cache of ``n_prompt`` entries in that dtype. ``keys`` per layer
    ``[1, kv_heads, kept, head_dim]``; ``live`` per layer ``[1, kv_heads, kept]`` bool or None
    (head-adaptive presses: hidden entries are stored, and counted); a kind's per-layer bytes
    (fp8 scales) are added per layer."""
    total = full = 0.0
    for k in keys:
        _, heads, kept, dim = k.shape
        width = k.element_size()
        full += heads * n_prompt * dim * 2 * width
        if quantization is None:
            total += heads * kept * dim * 2 * width
        else:
            total += heads * quantization.entry_bytes(kept, dim, width)
            total += quantization.layer_bytes
    return total, total / full


class QuantizingCache(DynamicCache):
    """A prefill ``DynamicCache`` that quantizes keys and values as they enter (gguf, fp8:
    the engine writes the cache before attention reads it); it stores and returns
    dequantized values."""

    def __init__(self, quantization: Quantization, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.quantization = quantization

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.quantization.entering(key_states, value_states)
        return super().update(keys, values, layer_idx, *args, **kwargs)


def parse_quantization(text: str, whole: str) -> Quantization:
    """``kivi:bits=2[,group=32][,residual=128]``, ``gguf:k=TYPE,v=TYPE`` or
    ``fp8:e4m3|e5m2[,scale=S]``."""
    head, _, tail = text.partition(":")
    kind = QUANTIZATIONS[head.strip().lower()]
    return kind.from_items([p.strip() for p in tail.split(",") if p.strip()], whole)


def is_quantization(text: str) -> bool:
    """Whether an action part names a quantization (``kivi:``, ``gguf:`` or ``fp8:``)."""
    return text.strip().lower().partition(":")[0] in QUANTIZATIONS


def quantization_table() -> list[tuple[str, str, str]]:
    """(spec, what, bits per key/value element at head_dim 64) rows for docs and help."""
    rows = []
    for bits in KIVI_BITS:
        q = KIVIQuantization(bits=bits)
        rows.append((f"kivi:bits={bits}[,group=32][,residual=128]",
                     "KIVI: keys per channel, values per token; last residual tokens full "
                     "precision", f"{q.bits_per_element()[0]:g}"))
    for name, t in GGUF_TYPES.items():
        rows.append((f"gguf:k={name},v={name}", "llama.cpp cache type (any k/v pair)",
                     f"{t.bits:g}"))
    for fmt in FP8_FORMATS:
        rows.append((f"fp8:{fmt}[,scale=1]", "vLLM/SGLang fp8 cache (per-tensor scale)", "8"))
    return rows


__all__ = ["KIVI_BITS", "QUANTIZATIONS", "FP8Quantization", "GGUFQuantization",
           "GeneratedView", "KIVIQuantization", "Quantization", "QuantizingCache",
           "is_quantization", "kv_memory", "parse_quantization", "quantization_table"]
