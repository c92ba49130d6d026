"""Two generators on one tokenizer: Q as another model than P (a room above the engine).

- :mod:`~kvdrift.lm.generators.weights`: P's linear weights quantized as llama.cpp's weight
  types by the ``gguf`` package's reference quantizers;
- :mod:`~kvdrift.lm.generators.tokenizers`: the one-tokenizer check (what differs, in a line);
- :mod:`~kvdrift.lm.generators.build`: Q's model from an ``@<model>`` spec or a model in
  memory, with the identity a store records;
- :mod:`~kvdrift.lm.generators.pair`: the kernel pair of two models, each side stepped by
  its own model's forward.
"""
