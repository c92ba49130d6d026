"""Loading a model and saying what was loaded.

:mod:`~kvdrift.lm.loading.model` loads a causal LM and its tokenizer offline (the embedded
SmolLM2 by default, its converted weights cached once); :mod:`~kvdrift.lm.loading.pretrained` gives
every ``from_pretrained`` call its options (local files, no remote code);
:mod:`~kvdrift.lm.loading.converted_cache` checks the converted-weights cache file by file;
:mod:`~kvdrift.lm.loading.digest` digests the weights and tokenizer a run ran on; and
:mod:`~kvdrift.lm.loading.user_model` measures a model the user loaded already and hands it back
as it was found.
"""
