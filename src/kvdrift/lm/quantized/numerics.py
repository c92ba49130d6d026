"""Quantizer numerics: quantize a tensor, then dequantize it (what a quantized cache's
attention reads), emulated in PyTorch.

llama.cpp cache types (``gguf_roundtrip``), blocks of 32 along the last axis (head_dim), per
token; each is the reference quantizer of the ``gguf`` package (``gguf.quants``, itself
bit-exact with ggml's ``quantize_row_*_ref``) operation for operation in float32, so the
dequantized values are equal entry by entry (tests/test_lm_quantize.py):

======  =====================  ========================================  ===================
type    bits per element       scale (float16 per block of 32)           code
======  =====================  ========================================  ===================
f16     16                     -                                         float16
q8_0    8.5 (34 B / 32)        d = amax / 127                            roundf(x / d)
q5_1    6 (24 B / 32)          d = (max - min) / 31, m = min             trunc((x - m)/d + .5)
q5_0    5.5 (22 B / 32)        d = (signed max by |x|) / -16             trunc(x / d + 16.5) - 16
q4_1    5 (20 B / 32)          d = (max - min) / 15, m = min             trunc((x - m)/d + .5)
q4_0    4.5 (18 B / 32)        d = (signed max by |x|) / -8              trunc(x / d + 8.5) - 8
======  =====================  ========================================  ===================

Codes are computed with the float32 scale and clipped to the type's range; dequantization uses
the scale (and minimum) rounded to float16, as stored.

KIVI (Liu et al. 2024, arXiv 2402.02750; ``minmax_roundtrip``): asymmetric min-max in groups,
``scale = (max - min) / (2^bits - 1)``, ``code = clamp(round((x - min) / scale), 0, 2^bits -
1)``, ``x' = code * scale + min``, computed in the tensor's dtype as KIVI's kernels do (a group
whose entries are all equal keeps them: code 0). Keys are grouped along tokens (per channel),
values along channels (per token).

fp8 (``fp8_roundtrip``), the cache dtypes of vLLM and SGLang (``--kv-cache-dtype fp8_e4m3`` /
``fp8_e5m2``): each entry divided by a per-tensor scale, converted to PyTorch's
``float8_e4m3fn`` or ``float8_e5m2`` (round to nearest even), and multiplied back. Out-of-range
entries saturate to the format's largest finite value, as the engines' conversion kernels do
(``__NV_SATFINITE``); PyTorch's own cast turns e5m2 overflow into infinity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvdrift import checks

GGUF_BLOCK = 32  # llama.cpp's block of entries along head_dim for every legacy quant type
FP8_FORMATS: dict[str, torch.dtype] = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class GGUFType:
    """One llama.cpp cache type: its name, bits per element (block scales included)."""

    name: str
    block_bytes: int  # bytes per block of GGUF_BLOCK entries (f16: 2 per entry)

    @property
    def bits(self) -> float:
        return self.block_bytes * 8 / GGUF_BLOCK


GGUF_TYPES: dict[str, GGUFType] = {t.name: t for t in (
    GGUFType("f16", 64), GGUFType("q8_0", 34), GGUFType("q5_1", 24), GGUFType("q5_0", 22),
    GGUFType("q4_1", 20), GGUFType("q4_0", 18))}


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """``[..., d]`` float32 as ``[..., d / 32, 32]`` blocks."""
    if x.shape[-1] % GGUF_BLOCK:
        raise ValueError(f"llama.cpp cache types need head_dim divisible by {GGUF_BLOCK}; got "
                         f"{x.shape[-1]}")
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // GGUF_BLOCK, GGUF_BLOCK)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _f16(t: torch.Tensor) -> torch.Tensor:
    return t.half().float()


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """Round half away from zero, as ``gguf.quants.np_roundf`` (C's ``roundf``)."""
    a = x.abs()
    floored = torch.floor(a)
    return torch.sign(x) * (floored + torch.floor(2 * (a - floored)))


def _signed_absmax(b: torch.Tensor) -> torch.Tensor:
    """The entry of largest magnitude (first on ties), sign kept: ``[..., 1]``."""
    return b.gather(-1, b.abs().argmax(-1, keepdim=True))


def gguf_roundtrip(x: torch.Tensor, type_name: str) -> torch.Tensor:
    """``x`` (``[..., head_dim]``) quantized to a llama.cpp type and dequantized, same dtype
    (the actions check ``type_name`` once, when they are made)."""
    if type_name == "f16":
        return x.half().to(x.dtype)
    b = _blocks(x)  # [..., nb, 32] float32
    if type_name == "q8_0":
        d = b.abs().amax(-1, keepdim=True) / 127
        out = (_roundf(b * _inverse(d)) + 0.0) * _f16(d)  # + 0.0: int8 code has no -0
    elif type_name in ("q4_0", "q5_0"):
        half = 8 if type_name == "q4_0" else 16
        d = _signed_absmax(b) / -half
        q = torch.trunc(b * _inverse(d) + (half + 0.5)).clamp(0, 2 * half - 1)
        out = _f16(d) * (q - half)
    elif type_name in ("q4_1", "q5_1"):
        top = 15 if type_name == "q4_1" else 31
        lo, hi = b.amin(-1, keepdim=True), b.amax(-1, keepdim=True)
        d = (hi - lo) / top
        q = torch.trunc((b - lo) * _inverse(d) + 0.5).clamp(0, top)
        out = _f16(d) * q + _f16(lo)
    else:
        checks.choice(type_name, "llama.cpp cache type", GGUF_TYPES)
        raise AssertionError(f"GGUF_TYPES lists {type_name!r}, which has no round trip here")
    return out.reshape(x.shape).to(x.dtype)


def minmax_dequantized(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                       bits: int) -> torch.Tensor:
    """KIVI's asymmetric min-max round trip of ``x`` given its group's ``lo``/``hi``
    (broadcast to ``x``)."""
    top = 2 ** bits - 1
    scale = (hi - lo) / top
    flat = scale == 0
    code = torch.where(flat, torch.zeros_like(x), (x - lo) / torch.where(flat, 1, scale))
    return code.round().clamp(0, top) * scale + lo


def minmax_roundtrip(x: torch.Tensor, bits: int, group: int, dim: int) -> torch.Tensor:
    """KIVI round trip of ``x`` in groups of ``group`` consecutive entries along ``dim``
    (``x.shape[dim]`` a multiple of ``group``)."""
    dim = dim % x.dim()
    size = x.shape[dim]
    if size % group:
        raise ValueError(f"{size} entries do not split into groups of {group}")
    grouped = x.reshape(*x.shape[:dim], size // group, group, *x.shape[dim + 1:])
    lo = grouped.amin(dim + 1, keepdim=True)
    hi = grouped.amax(dim + 1, keepdim=True)
    return minmax_dequantized(grouped, lo, hi, bits).reshape(x.shape)


def fp8_roundtrip(x: torch.Tensor, fmt: str, scale: float = 1.0) -> torch.Tensor:
    """``x`` stored as fp8 ``fmt`` (``e4m3`` or ``e5m2``) with a per-tensor ``scale`` and read
    back, same dtype: ``sat(x / scale).to(fp8) * scale``."""
    dtype = FP8_FORMATS[fmt]
    top = torch.finfo(dtype).max
    stored = (x.float() / scale).clamp(-top, top).to(dtype)
    return (stored.float() * scale).to(x.dtype)


__all__ = ["FP8_FORMATS", "GGUF_BLOCK", "GGUF_TYPES", "GGUFType", "fp8_roundtrip",
           "gguf_roundtrip", "minmax_dequantized", "minmax_roundtrip"]
