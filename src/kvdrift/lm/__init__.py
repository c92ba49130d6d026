"""The language-model world behind the KernelPair protocol.

- :mod:`kvdrift.lm.model`: ``load_model`` (embedded SmolLM2 by default, cached once) and
  ``encode_prompt``;
- :mod:`kvdrift.lm.actions`: ``Action`` / ``parse_action`` (a kvpress press + an exact budget);
- :mod:`kvdrift.lm.pair`: ``LMKernelPair`` (full versus evicted prompt cache, batched states);
- :mod:`kvdrift.lm.cache`: the in-place growing KV cache used by path states.

Import the submodules directly; this package does not import kvpress or transformers itself.
"""
