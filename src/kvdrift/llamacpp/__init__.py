"""llama.cpp as an engine: the kernel-pair protocol over llama.cpp contexts (docs/llama-cpp.md).

P runs a GGUF file with an f16 cache; Q the same or another GGUF file with llama.cpp's own cache
types (``-ctk``/``-ctv``) and flash attention on or off. Replicates are sequences of one context
that share the prompt's cells; every estimator, record and report runs unchanged on it.

- :mod:`~kvdrift.llamacpp.binding`: importing ``llama-cpp-python`` (one line where it is missing).
- :mod:`~kvdrift.llamacpp.cache_types`: the engine's actions (cache types, flash attention).
- :mod:`~kvdrift.llamacpp.files`: GGUF files checked before loading, requantized copies.
- :mod:`~kvdrift.llamacpp.sequences`: one context's sequences sharing a prompt.
- :mod:`~kvdrift.llamacpp.pair`: the kernel pair.
- :mod:`~kvdrift.llamacpp.factory`: pairs for (document, action) units.
"""
