"""A presses file as a user writes one (given with --presses by tests/test_user_presses.py):
a ScorerPress of its own that kvpress does not have, and a family of it for the frontier."""

from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class ValueNormPress(ScorerPress):
    """Keep the entries whose values have the largest norm."""

    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return values.norm(dim=-1)  # [bsz, num_key_value_heads, k_len]


PRESSES = {"vnorm-half": ValueNormPress(compression_ratio=0.5)}
FAMILIES = {"vnorm": lambda kept: ValueNormPress(compression_ratio=1 - kept)}
