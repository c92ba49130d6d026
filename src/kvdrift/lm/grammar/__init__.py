"""The action grammar: what an action spec may say, checked without torch, transformers or kvpress.

:mod:`~kvdrift.lm.grammar.names` lists the names a spec may use (so the command line refuses an
unknown action before anything heavy is imported) and :mod:`~kvdrift.lm.grammar.fields` splits
``--actions`` into specs and a spec into its ``key=value`` fields, with the values allowed. Every
other part of ``lm/`` that reads a spec builds on these two modules.
"""
