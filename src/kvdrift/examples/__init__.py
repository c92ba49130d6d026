"""The generations themselves: a run's token records decoded with its own tokenizer, which
replicates to show (the examples rule), and the prompt they continue.

``kvdrift show``, :func:`kvdrift.trajectories` and the report's
"Examples" section read the records through this package; nothing here changes a number.
"""
