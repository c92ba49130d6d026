"""The language-model world behind the KernelPair protocol.

- :mod:`kvdrift.lm.model`: ``load_model`` (embedded SmolLM2 by default, cached once) and
  ``encode_prompt``;
- :mod:`kvdrift.lm.actions`: ``Action`` / ``parse_action`` (chained kvpress presses, named);
- :mod:`kvdrift.lm.presses`: the offered kvpress presses as stages with exact kept counts;
- :mod:`kvdrift.lm.prefill`: ``prefill`` into a ``PromptCache`` (full, or compressed by an action);
- :mod:`kvdrift.lm.pair`: ``LMKernelPair`` (full versus evicted prompt cache, batched states);
- :mod:`kvdrift.lm.cache`: the shared-prompt KV cache used by path states;
- :mod:`kvdrift.lm.shared_attention`: exact attention over shared prompt + own entries, masks;
- :mod:`kvdrift.lm.decoding`: decode-time eviction (``DecodingPress``) per row.
- :mod:`kvdrift.lm.press_path`: the general path, any kvpress press object as an action
  (Q's cache as the press left it; ``PressFailed``);
- :mod:`kvdrift.lm.press_identity`: a press's class, fields and source digest.

Import the submodules directly; this package does not import kvpress or transformers itself.
"""
