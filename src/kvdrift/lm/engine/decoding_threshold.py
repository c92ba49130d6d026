"""Decode-time eviction by threshold (kvpress's ``DMSPress`` with ``decoding=True``) on every row.

DMSPress scores each entry once, when it is written (the prompt's at prefill, each generated
token's at its step, from that token's own hidden state, key and value), and keeps the
scores of the last ``sliding_window_size`` entries in a window. An entry leaving the window
is hidden in every KV head where its score is below ``threshold``; it is never shown again.
After generated step ``L`` (cache length ``n + L`` for an ``n``-token prompt) the entry
leaving is the one at cache index ``n + L - 1 - W`` (none while that is negative).

kvdrift reads the prompt's window of scores from the press after its prefill, and scores a
generated entry again when it leaves the window, from the attention input, key and value of
its own step (the same computation on the same numbers as kvpress's at that step). Hidden
entries are recorded as evictions at step ``L`` (:class:`~kvdrift.lm.engine.decoding.
DecodeEvictions`), so truncation and forks replay them like a ``DecodingPress``'s. kvpress
hides an entry by writing a fake key over it whose attention weight underflows to zero;
kvdrift masks it exactly (equal up to float noise, as for head-adaptive prefill presses).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvdrift.lm.engine.decoding import scoring
from kvdrift.lm.engine.press_rules import scorer_problem
from kvdrift.lm.engine.score_shapes import check_scores


@dataclass(frozen=True)
class ThresholdRule:
    """``DMSPress(decoding=True)`` ``press`` as a decoding-time rule, named ``label``."""

    press: Any  # kvpress.DMSPress with decoding=True
    label: str
    failure: Callable[[str], Exception] = ValueError
    n_prompt: int = 0
    # per layer [kv, b]: scores of the last b = min(n_prompt, W) prompt entries after prefill
    prompt_scores: tuple[torch.Tensor, ...] = ()
    spec: bool = False
    target: int = 1  # (DecodeEvictions' order width; this rule keeps no order)

    def for_prompt(self, n_prompt: int) -> ThresholdRule:
        return dataclasses.replace(self, n_prompt=n_prompt)

    def after_prefill(self, press: Any, n_layers: int) -> ThresholdRule:
        """The rule with the window of prompt scores ``press`` (the one that ran the
        prefill) holds."""
        buffers = press.scores_buffer
        return dataclasses.replace(self, prompt_scores=tuple(
            buffers[i][0].detach().clone() for i in range(n_layers)))

    @property
    def window(self) -> int:
        return int(self.press.sliding_window_size)

    def check(self, action: str | None = None, horizon: int | None = None) -> None:
        """Raise ``failure`` (one line) if the press's scorer cannot score one token alone."""
        scorer = self.press.press
        found = scorer_problem(scorer, "its DMSPress")
        window = getattr(scorer, "window_size", None)
        if found is None and isinstance(window, int) and window >= 1 and \
                hasattr(scorer, "compute_window_attention"):
            found = (f"its DMSPress scores each generated token alone (one hidden state), but "
                     f"its {type(scorer).__name__} looks at the last window_size={window}; "
                     f"score with a press that reads one token (e.g. KnormPress)")
        if found is not None:
            raise self.failure(found if action is None else f"action {action!r}: {found}")

    def compresses(self, lengths: torch.Tensor) -> torch.Tensor:
        """``[n]`` bool: rows at which an entry leaves the window after these lengths."""
        return self.n_prompt + lengths - 1 - self.window >= 0

    def compress(self, ev: Any, rows: torch.Tensor, lengths: torch.Tensor,
                 slots: torch.Tensor, slot_step: torch.Tensor, cache: Any,
                 modules: list[Any], positions: Any = None) -> Any:
        """``ev`` with the entry leaving each row's window hidden where it scores below the
        threshold (module docstring; ``positions`` is not needed)."""
        prompt = [p.clone() for p in ev.prompt]
        own = [o.clone() for o in ev.own]
        n, threshold = self.n_prompt, self.press.threshold
        for i in rows.tolist():
            length = int(lengths[i])
            c = n + length - 1 - self.window  # the cache index leaving the window
            for layer_idx, module in enumerate(modules):
                if c < n:
                    scores = self.prompt_scores[layer_idx]
                    score = scores[:, c - (n - scores.shape[1])]  # [kv]
                    prompt[layer_idx][i][score < threshold, c] = length
                    continue
                slot = int(torch.nonzero(slots[i] & (slot_step[i] == c - n))[0, 0])
                layer = cache.layers[layer_idx]
                score = self.entry_score(module, ev.inputs[layer_idx][i, c - n],
                                         layer.keys[i, :, slot], layer.values[i, :, slot], c)
                own[layer_idx][i][score < threshold, slot] = length
        return dataclasses.replace(ev, prompt=tuple(prompt), own=tuple(own))

    def entry_score(self, module: Any, hidden: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, position: int) -> torch.Tensor:
        """``[kv]``: the scorer's score of one generated entry (its own step's attention input
        ``[hidden]``, key and value ``[kv, dim]``, written at cache ``position``), as kvpress
        scored it at that step; the entry is hidden where it is below ``threshold``."""
        hidden = hidden[None, None]  # [1, 1, hidden]
        ids = torch.tensor([[position]], device=hidden.device)
        kwargs = {"hidden_states": hidden, "position_embeddings": module.rotary_emb(hidden, ids),
                  "cache_position": ids[0], "position_ids": ids}
        with scoring(self.failure, f"{self.label}: {type(self.press.press).__name__} cannot "
                     f"score a generated token", hidden.device):
            scores = self.press.press.score(module, hidden, key[None, :, None],
                                            value[None, :, None], None, kwargs)
            check_scores(self.press.press, scores, key[None, :, None])
            return scores[0, :, 0]


__all__ = ["ThresholdRule"]
