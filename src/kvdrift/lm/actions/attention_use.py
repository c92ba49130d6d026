"""Which presses read the attention weights, so that their prefill runs with eager attention.

kvpress hands a press's ``score`` (and ``compress``, ``forward_hook``) the layer's attention
weights as ``attentions``, which only eager attention computes (SDPA and the fused kernels give
None). kvpress's ``ObservedAttentionPress`` needs them, and so does a press of one's own whose
scorer reads them, as kvpress's ``new_press.ipynb`` teaches: the user of kvpress loads the model
with ``attn_implementation="eager"``. kvdrift switches the prefill of such a press to eager
attention by itself (:func:`needs_eager`), or for every press object when asked
(``attention = "eager"`` in a study, ``kvdrift run --attention eager``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any

import kvpress

ATTENTION_CHOICES = ("auto", "eager")
"""The prefill attention of press objects: ``auto`` (eager where :func:`needs_eager`), or
``eager`` for every one."""
_READERS = ("score", "compress", "forward_hook")


def nested_presses(press: Any) -> list[Any]:
    """``press`` and every press inside it (wrappers, compositions); [] for None."""
    if press is None:
        return []
    found = [press]
    if dataclasses.is_dataclass(press):
        for f in dataclasses.fields(press):
            value = getattr(press, f.name, None)
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, kvpress.BasePress):
                    found += nested_presses(item)
    return found


def _reads_attentions(cls: type) -> bool:
    """Whether a class of one's own (not kvpress's) reads ``attentions`` in a scoring method:
    the name is loaded (used) in its body, not only received as a parameter."""
    if cls.__module__.split(".")[0] == "kvpress":
        return False
    for name in _READERS:
        method = cls.__dict__.get(name)
        if method is None:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        except (OSError, TypeError, SyntaxError):  # no source to read: assume it may
            return True
        if any(isinstance(node, ast.Name) and node.id == "attentions"
               and isinstance(node.ctx, ast.Load) for node in ast.walk(tree)):
            return True
    return any(_reads_attentions(base) for base in cls.__bases__
               if base is not object and base.__module__.split(".")[0] != "kvpress")


def needs_eager(press: Any) -> bool:
    """Whether a press reads eager attention weights: kvpress's ObservedAttentionPress, or a
    class of one's own whose ``score``, ``compress`` or ``forward_hook`` uses ``attentions``,
    anywhere in it."""
    return any(isinstance(p, kvpress.ObservedAttentionPress) or _reads_attentions(type(p))
               for p in nested_presses(press))
