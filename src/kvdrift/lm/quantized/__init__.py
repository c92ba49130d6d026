"""Quantized caches: the KV cache stored at fewer bits, as a transform of Q's entries.

:mod:`~kvdrift.lm.quantized.numerics` quantizes a tensor and dequantizes it back (what a
quantized cache's attention reads: KIVI's per-channel keys and per-token values, llama.cpp's
``q4_0``/``q8_0`` blocks through the ``gguf`` package's reference quantizers);
:mod:`~kvdrift.lm.quantized.transform` parses a quantization action (``kivi:bits=4``) and applies
it to Q's prompt cache and to each entry Q generates, with the bytes it stores (``kv_memory``).
"""
