"""Weight-only quantization of a model's linear layers as llama.cpp stores them.

Each linear layer of the decoder blocks (attention and MLP projections) is quantized with the
``gguf`` package's reference quantizer for a llama.cpp weight type (``Q8_0``: blocks of 32
weights sharing one float16 scale; ``Q4_0``: 4 bits per weight, blocks of 32; ...) and
dequantized back into the model's dtype: the model then computes with exactly the weight
values a GGUF file of that type holds. Embeddings, norms and the output head keep their
precision (llama.cpp's mixes quantize them too, usually at a higher type; docs/two-models.md).

Why ``gguf``: it is llama.cpp's own reference for its types, a dependency kvdrift already has
(its cache types use it), runs wherever numpy does, and makes Q an ordinary model of P's dtype:
its generation is deterministic and equals its own ``generate`` token for token. The bytes a
type would hold (:func:`quantized_bytes`) are read from the quantized arrays themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

#: The block of weights one scale covers in every type kvdrift offers (along the input).
BLOCK = 32


@dataclass(frozen=True)
class QuantizedWeights:
    """What quantizing a model did: how many linear layers, their bytes as the type stores
    them, and the bytes of every other parameter (at the model's dtype)."""

    layers: int
    quantized_bytes: int
    other_bytes: int

    @property
    def total_bytes(self) -> int:
        """The model's weights as a file of this type would hold them (this module's mix)."""
        return self.quantized_bytes + self.other_bytes


def _ggml_type(name: str) -> Any:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[name.upper()]


def quantized_linears(model: Any) -> list[tuple[str, torch.nn.Linear]]:
    """The linear layers whose weights are quantized: every ``nn.Linear`` inside the decoder
    blocks (the output head and embeddings are left out), in name order."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [(name, module) for name, module in sorted(model.named_modules())
            if isinstance(module, torch.nn.Linear) and module is not head]


def check_quantizable(model: Any, weights: str) -> None:
    """One-line ValueError unless every linear layer's input size is a multiple of the
    type's block (llama.cpp's rows are whole blocks)."""
    for name, module in quantized_linears(model):
        if module.in_features % BLOCK:
            raise ValueError(f"weight type {weights} quantizes rows in blocks of {BLOCK}; layer "
                             f"{name} has {module.in_features} inputs, not a multiple of "
                             f"{BLOCK} (use a dtype instead, e.g. @bfloat16)")
    if not quantized_linears(model):
        raise ValueError(f"weight type {weights}: the model has no linear layers to quantize")


def quantize_weights(model: Any, weights: str) -> QuantizedWeights:
    """Quantize ``model``'s linear weights in place as llama.cpp's ``weights`` type (and
    dequantize them back into their dtype); returns the bytes the type holds."""
    import gguf.quants

    check_quantizable(model, weights)
    kind = _ggml_type(weights)
    layers, stored = quantized_linears(model), 0
    done = set()
    with torch.no_grad():
        for _, module in layers:
            weight = module.weight
            values = weight.detach().float().cpu().numpy()  # [out, in]
            packed = gguf.quants.quantize(values, kind)
            stored += int(packed.nbytes)
            back = np.ascontiguousarray(gguf.quants.dequantize(packed, kind))
            weight.copy_(torch.from_numpy(back).reshape(weight.shape).to(weight.dtype))
            done.add(id(weight))
    other = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in done)
    return QuantizedWeights(len(layers), stored, int(other))


def parameter_bytes(model: Any) -> int:
    """Bytes of a model's parameters at their dtype (each shared tensor once)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[id(p)] = p.numel() * p.element_size()
    return sum(seen.values())
