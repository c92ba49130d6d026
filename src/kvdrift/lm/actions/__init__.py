"""Actions: what Q does to its cache, as a spec string or a kvpress press object.

:mod:`~kvdrift.lm.actions.spec` parses a chained spec (``snapkv-half+kivi:bits=4``) into an
``Action``; :mod:`~kvdrift.lm.actions.presses` holds the kvpress presses kvdrift offers by name, as
stages with exact kept counts (and which presses it does not offer, and why);
:mod:`~kvdrift.lm.actions.identity` says what a press object is (class, fields, source digest), so
a store never mixes two presses' records. Running an action on a model is the engine's job
(:mod:`kvdrift.lm.engine`).
"""
