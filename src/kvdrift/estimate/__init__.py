"""Estimators written once against the kernel-pair protocol."""

from kvdrift.estimate.rollout import RolloutResult, coupled_rollouts, first_mismatch
from kvdrift.estimate.swrb import SWRBResult, swrb, unobserved_capacity

__all__ = [
    "RolloutResult",
    "SWRBResult",
    "coupled_rollouts",
    "first_mismatch",
    "swrb",
    "unobserved_capacity",
]
