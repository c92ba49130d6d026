"""The estimators a run offers, one class each: how it steps a kernel pair and which record
tables it writes.

A study names its estimator as text (``estimator = "swrb"``, ``--estimator swrb``);
:func:`parse_estimator` turns the text into the object once, and the runner asks the
object. Records and stored configurations keep the name (:attr:`Estimator.name`).
"""

from __future__ import annotations

import pyarrow as pa
import torch

from kvdrift import checks
from kvdrift.data.document import Document
from kvdrift.estimate import RolloutResult, SWRBResult, coupled_rollouts, swrb
from kvdrift.kernel import KernelPair
from kvdrift.records.schema import RECORDED_ESTIMATORS, RecordedEstimator
from kvdrift.run.outcomes import with_scores
from kvdrift.run.records import UnitKey, rollout_tables, swrb_tables


class Estimator:
    """One estimator. Instances are stateless and compare (and copy) as their name."""

    name: str = ""
    records: RecordedEstimator  # what its records hold

    def estimate(self, pair: KernelPair, replicates: int, horizon: int, depths: tuple[int, ...],
            temperature: float, generator: torch.Generator) -> RolloutResult | SWRBResult:
        """``replicates`` replicates on ``pair``, drawing from ``generator``."""
        raise NotImplementedError

    def tables(self, key: UnitKey, result, depths: tuple[int, ...], doc: Document,
               pair: KernelPair, decoder: object) -> tuple[pa.Table, pa.Table]:
        """The unit's step and replicate tables of ``result``."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Estimator) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __deepcopy__(self, memo: dict) -> Estimator:
        return self


class Rollouts(Estimator):
    """Complete coupled rollouts (:func:`~kvdrift.estimate.coupled_rollouts`): both branches
    from the start; window terms per depth, and task scores where the document has answers."""

    name = "rollout"
    records = RECORDED_ESTIMATORS["rollout"]

    def estimate(self, pair, replicates, horizon, depths, temperature, generator):
        return coupled_rollouts(pair, replicates, horizon, temperature, generator)

    def tables(self, key, result, depths, doc, pair, decoder):
        steps, reps = rollout_tables(key, result, depths)
        return steps, with_scores(reps, doc, result.x, result.y, pair.eos_token_id, decoder)


class SWRB(Estimator):
    """Survival-weighted residual branching (:func:`~kvdrift.estimate.swrb`); without depths
    it observes the whole horizon."""

    name = "swrb"
    records = RECORDED_ESTIMATORS["swrb"]

    def estimate(self, pair, replicates, horizon, depths, temperature, generator):
        return swrb(pair, replicates, horizon, depths or (horizon,), temperature, generator)

    def tables(self, key, result, depths, doc, pair, decoder):
        return swrb_tables(key, result)


ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (Rollouts(), SWRB())}
"""Every estimator by the name a study gives it."""


def parse_estimator(name: str | Estimator) -> Estimator:
    """The estimator named ``name`` (an estimator is returned as it is)."""
    if isinstance(name, Estimator):
        return name
    return ESTIMATORS[checks.choice(name, "estimator", ESTIMATORS)]
