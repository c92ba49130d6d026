"""Quantization actions: a transform of Q's prompt cache and of Q's generated entries.

An action may end with one quantization (alone, or after eviction presses joined with ``+``:
``snapkv:ratio=0.5+kivi:bits=4`` evicts, then quantizes what is kept). Attention reads the
dequantized values (the numerics of :mod:`kvdrift.lm.quantize`), which is what a quantized
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

Sizes (``kv_bytes``) count Q's prompt cache: quantized entries at their bits, one float16
scale (and for asymmetric types one float16 minimum) per group, full-precision entries at
the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from kvdrift.lm.quantize import (
    GGUF_BLOCK,
    GGUF_TYPES,
    gguf_roundtrip,
    minmax_dequantized,
    minmax_roundtrip,
)
from kvdrift.lm.spec_fields import split_fields

KIVI_BITS = (2, 4, 8)
SCALE_BITS = 16  # KIVI's and llama.cpp's scales and minima are float16


@dataclass(frozen=True)
class Quantization:
    """A cache quantization: ``kind`` ``"kivi"`` (``bits``, ``group``, ``residual``) or
    ``"gguf"`` (``k``, ``v``: llama.cpp type names)."""

    kind: str
    bits: int = 2
    group: int = 32
    residual: int = 128
    k: str = "f16"
    v: str = "f16"

    def __post_init__(self) -> None:
        if self.kind == "kivi":
            if self.bits not in KIVI_BITS:
                raise ValueError(f"kivi: bits must be one of {', '.join(map(str, KIVI_BITS))}; "
                                 f"got {self.bits}")
            if self.group < 1:
                raise ValueError(f"kivi: group must be an integer >= 1; got {self.group}")
            if self.residual < self.group or self.residual % self.group:
                raise ValueError(f"kivi: residual must be a positive multiple of group "
                                 f"({self.group}); got {self.residual}")
        elif self.kind == "gguf":
            for side, name in (("k", self.k), ("v", self.v)):
                if name not in GGUF_TYPES:
                    raise ValueError(f"gguf: {side}={name!r} is not a llama.cpp cache type; "
                                     f"allowed: {', '.join(GGUF_TYPES)}")
        else:
            raise ValueError(f"unknown quantization {self.kind!r}; allowed: kivi, gguf")

    @property
    def label(self) -> str:
        if self.kind == "kivi":
            return f"kivi:bits={self.bits},group={self.group},residual={self.residual}"
        return f"gguf:k={self.k},v={self.v}"

    @property
    def before_attention(self) -> bool:
        """Whether entries are quantized before the prefill's attention reads them (gguf)."""
        return self.kind == "gguf"

    def check(self, head_dim: int) -> None:
        """ValueError unless the groups divide the model's ``head_dim``."""
        group = self.group if self.kind == "kivi" else GGUF_BLOCK
        if head_dim % group:
            what = "kivi: group" if self.kind == "kivi" else "gguf: the block of 32"
            raise ValueError(f"{what} ({group}) must divide the model's head_dim ({head_dim}); "
                             f"allowed groups: divisors of {head_dim}")

    # --- bits --------------------------------------------------------------------------
    def bits_per_element(self, head_dim: int = 64) -> tuple[float, float]:
        """Bits per key and per value element of quantized entries, scales included."""
        if self.kind == "gguf":
            return GGUF_TYPES[self.k].bits, GGUF_TYPES[self.v].bits
        extra = 2 * SCALE_BITS / self.group  # scale and minimum per group
        return self.bits + extra, self.bits + extra

    def entry_bytes(self, kept: int, head_dim: int, dtype_bytes: int) -> float:
        """Bytes of one KV head's prompt entries (keys and values) for ``kept`` entries."""
        kbits, vbits = self.bits_per_element(head_dim)
        if self.kind == "gguf":
            return kept * head_dim * (kbits + vbits) / 8
        kq = kept - kept % self.residual
        vq = max(0, kept - self.residual)
        full = (kept - kq) + (kept - vq)
        return head_dim * (kq * kbits + vq * vbits) / 8 + full * head_dim * dtype_bytes

    # --- transforms ----------------------------------------------------------------------
    def prompt(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One layer's prompt entries ``[1, kv_heads, k, head_dim]`` after quantization
        (new tensors; gguf entries are already quantized by their prefill)."""
        if self.kind == "gguf":
            return gguf_roundtrip(keys, self.k), gguf_roundtrip(values, self.v)
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
        """What attention reads of the rows' generated entries (module docstring).

        keys, values: ``[n, kv_heads, G, head_dim]`` full precision; steps: ``[n, G]``
        generated index held by each slot; valid: ``[n, G]`` bool, slots the row attends to;
        before: ``[n]`` generated tokens before the new one. Rows never mix.
        """
        if self.kind == "gguf":
            return gguf_roundtrip(keys, self.k), gguf_roundtrip(values, self.v)
        r = self.residual
        k_quant = valid & (steps < (before // r * r)[:, None])  # [n, G]
        v_quant = valid & (steps < (before - r)[:, None])
        if bool(k_quant.any()):
            keys = _grouped_keys(keys, k_quant, steps, self.bits, self.group)
        if bool(v_quant.any()):
            per_token = minmax_roundtrip(values, self.bits, self.group, dim=3)
            values = torch.where(v_quant[:, None, :, None], per_token, values)
        return keys, values


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
    (head-adaptive presses: hidden entries are stored, and counted)."""
    total = full = 0.0
    for k in keys:
        _, heads, kept, dim = k.shape
        width = k.element_size()
        full += heads * n_prompt * dim * 2 * width
        if quantization is None:
            total += heads * kept * dim * 2 * width
        else:
            total += heads * quantization.entry_bytes(kept, dim, width)
    return total, total / full


class QuantizingCache(DynamicCache):
    """A prefill ``DynamicCache`` that quantizes keys and values as they enter (gguf: llama.cpp
    writes the cache before attention reads it); it stores and returns dequantized values."""

    def __init__(self, quantization: Quantization, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.quantization = quantization

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.quantization
        return super().update(gguf_roundtrip(key_states, q.k), gguf_roundtrip(value_states, q.v),
                              layer_idx, *args, **kwargs)


def parse_quantization(text: str, whole: str) -> Quantization:
    """``kivi:bits=2[,group=32][,residual=128]`` or ``gguf:k=TYPE,v=TYPE``."""
    head, _, tail = text.partition(":")
    kind = head.strip().lower()
    fields = {"kivi": ("bits", "group", "residual"), "gguf": ("k", "v")}[kind]
    values: dict[str, Any] = {}
    for key, value in split_fields(tail, whole):
        if key not in fields:
            raise ValueError(f"action {whole!r}: {kind} takes {', '.join(f + '=' for f in fields)}"
                             f"; got {key}={value}")
        if kind == "kivi":
            try:
                values[key] = int(value)
            except ValueError:
                raise ValueError(f"action {whole!r}: kivi {key} must be an integer; got "
                                 f"{value!r}") from None
        else:
            values[key] = value.lower()
    if kind == "kivi" and "bits" not in values:
        raise ValueError(f"action {whole!r}: kivi needs bits= (one of "
                         f"{', '.join(map(str, KIVI_BITS))})")
    if kind == "gguf" and set(values) != {"k", "v"}:
        raise ValueError(f"action {whole!r}: gguf needs k=TYPE,v=TYPE with TYPE one of "
                         f"{', '.join(GGUF_TYPES)}")
    try:
        return Quantization(kind=kind, **values)
    except ValueError as exc:
        raise ValueError(f"action {whole!r}: {exc}") from None


def is_quantization(text: str) -> bool:
    """Whether an action part names a quantization (``kivi:...`` or ``gguf:...``)."""
    return text.strip().lower().partition(":")[0] in ("kivi", "gguf")


def quantization_table() -> list[tuple[str, str, str]]:
    """(spec, what, bits per key/value element at head_dim 64) rows for docs and help."""
    rows = []
    for bits in KIVI_BITS:
        q = Quantization("kivi", bits=bits)
        rows.append((f"kivi:bits={bits}[,group=32][,residual=128]",
                     "KIVI: keys per channel, values per token; last residual tokens full "
                     "precision", f"{q.bits_per_element()[0]:g}"))
    for name, t in GGUF_TYPES.items():
        rows.append((f"gguf:k={name},v={name}", "llama.cpp cache type (any k/v pair)",
                     f"{t.bits:g}"))
    return rows


__all__ = ["KIVI_BITS", "GeneratedView", "Quantization", "QuantizingCache", "is_quantization",
           "kv_memory", "parse_quantization", "quantization_table"]
