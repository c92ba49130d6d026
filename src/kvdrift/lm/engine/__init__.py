"""The decoding engine: P and Q stepped on batches of rows, one joint forward per position.

Open this folder for how a row's cache is built, shared and compressed during generation.
:mod:`~kvdrift.lm.engine.prefill` runs each prompt once into the full prompt cache and one
compressed cache per action; :mod:`~kvdrift.lm.engine.cache` keeps the prompt part shared by every
row and the generated part per row; :mod:`~kvdrift.lm.engine.shared_attention` is the exact
attention over both (registered with transformers); :mod:`~kvdrift.lm.engine.decoding` compresses
each row during generation as a decoding-time press would: every slot kept and masked, so a
row can go back (DMS's threshold eviction in :mod:`~kvdrift.lm.engine.decoding_threshold`;
which press becomes which rule in :mod:`~kvdrift.lm.engine.decoding_presses`; the rules a press
imposes on its settings, checked before a run writes, in
:mod:`~kvdrift.lm.engine.press_rules`; one compression step's input and output in
:mod:`~kvdrift.lm.engine.row_compression`), while :mod:`~kvdrift.lm.engine.live_rows` holds rows
that keep only what the press keeps (memory O(target + interval); one row's live entries are a
:mod:`~kvdrift.lm.engine.live_entries`); :mod:`~kvdrift.lm.engine.pair` is the ``LMKernelPair``
the estimators step; :mod:`~kvdrift.lm.engine.press_path` is the general path beside the fast
one (any kvpress press object, its cache as the press left it); and
:mod:`~kvdrift.lm.engine.entry_positions` says which prompt position each of Q's entries holds.
"""
