"""The language-model world behind the KernelPair protocol, in six rooms, lowest first.

- :mod:`kvdrift.lm.grammar`: what an action spec may say, checked without torch or kvpress;
- :mod:`kvdrift.lm.loading`: loading a model and its tokenizer, and digests of what was loaded;
- :mod:`kvdrift.lm.quantized`: quantized caches (KIVI, llama.cpp's cache types) as transforms;
- :mod:`kvdrift.lm.actions`: actions (chained spec strings, the named kvpress presses, the
  identity of a press object);
- :mod:`kvdrift.lm.engine`: the decoding engine (prefill, the shared prompt cache, shared
  attention, decoding-time compression, ``LMKernelPair``, the general path for press objects).
- :mod:`kvdrift.lm.generators`: Q as another model on P's tokenizer (a weight type, a dtype,
  an attention implementation, another checkpoint, a model handed over) and the two-model pair.

Above them, :mod:`kvdrift.lm.factory` hands out kernel pairs for (document, action) units on one
loaded model and :mod:`kvdrift.lm.attribution` says what Q's cache had lost at a divergence.
A room imports only from rooms listed before it. Import the submodules directly; this package does
not import kvpress or transformers itself.
"""
