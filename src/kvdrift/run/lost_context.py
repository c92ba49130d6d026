"""The replicate columns of what Q's cache had lost at each divergence (``attribution``).

For every rollout replicate that diverged (tau >= 1),
:func:`kvdrift.lm.attribution.lost_contexts` replays P's step at tau (a unit's replicates in
one batch) and ranks the prompt positions by the attention mass P put there on entries Q's
cache lost; this module turns that into the columns :data:`~kvdrift.records.schema.LOST`
declares, with each position's token and its context in the prompt decoded by the model's
tokenizer. A replicate that never diverged gets NaN and empty lists, and so does every
replicate of an action that evicts during decoding (``decoding-*``: only the prompt cache is
compared, which would miss what it lost).
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

from kvdrift.data.document import Document
from kvdrift.estimate import RolloutResult
from kvdrift.records.schema import LOST

#: Prompt tokens shown on each side of a lost position in its context.
CONTEXT_TOKENS = 6
#: Marks around the lost token in its context.
OPEN, CLOSE = "⟦", "⟧"


def context_text(tokenizer: Any, ids: list[int], j: int, width: int = CONTEXT_TOKENS) -> str:
    """The prompt around position ``j``: ``width`` tokens either side, the token in ⟦ ⟧."""
    def text(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=False)

    return (text(ids[max(0, j - width):j]) + OPEN + text([ids[j]]) + CLOSE
            + text(ids[j + 1:j + 1 + width]))


def with_lost_context(replicates: pa.Table, result: RolloutResult, pair: Any, factory: Any,
                      doc: Document) -> pa.Table:
    """``replicates`` with the :data:`~kvdrift.records.schema.LOST` columns (a language-model
    pair from a factory that encodes prompts and holds the tokenizer)."""
    from kvdrift.lm.attribution import lost_contexts

    if not isinstance(result, RolloutResult) or not hasattr(pair, "prompt_cache") \
            or not hasattr(factory, "prompt_ids"):
        raise ValueError("attribution needs complete rollouts on a language model")
    tokenizer = factory.loaded.tokenizer
    prompt_ids = factory.prompt_ids(doc)  # [1, n]
    ids = [int(i) for i in prompt_ids[0]]
    taus = [int(t) for t in result.tau]
    # decode-time eviction changes Q's cache after the prompt, which is not compared: none
    measured = not getattr(getattr(pair, "action", None), "evicts_during_decoding", False)
    diverged = [r for r, tau in enumerate(taus) if tau >= 1 and measured]
    found = dict(zip(diverged, lost_contexts(
        pair.model, pair.prompt_cache("p"), pair.prompt_cache("q"), prompt_ids,
        [result.x[r, :taus[r] - 1] for r in diverged]), strict=True))
    columns: dict[str, list] = {c.name: [] for c in LOST}
    for r in range(len(taus)):
        lost = found.get(r)
        positions = () if lost is None else lost.positions
        columns["lost_mass"].append(math.nan if lost is None else lost.lost_mass)
        columns["lost_positions"].append(list(positions))
        columns["lost_shares"].append([] if lost is None else list(lost.shares))
        columns["lost_tokens"].append([tokenizer.decode([ids[j]], skip_special_tokens=False)
                                       for j in positions])
        columns["lost_contexts"].append([context_text(tokenizer, ids, j) for j in positions])
    for c in LOST:
        replicates = replicates.append_column(c.name, pa.array(columns[c.name], c.dtype,
                                                                from_pandas=True))
    return replicates
