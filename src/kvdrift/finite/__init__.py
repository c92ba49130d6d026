"""The finite-state world: kernel pairs as explicit tables, and the exact truth they allow.

P and Q are explicit next-token tables over a small vocabulary and horizon. Here every
quantity of docs/method.md (R, O_H, E_H, Pi_H, C_H, F, p_s, rho, R_L, B_L) can be computed exactly,
so estimators are tested against exact values rather than against other estimators.

- :mod:`kvdrift.finite.pair`: :class:`FinitePair`, the kernel pair of two tables;
- :mod:`kvdrift.finite.systems`: random pairs, the paper's systems, the extremal construction;
- :mod:`kvdrift.finite.exact`: exact enumeration (:func:`exact` -> :class:`ExactRisk`);
- :mod:`kvdrift.finite.check`: the paper's finite-state check (``kvdrift finite-state``);
- :mod:`kvdrift.finite.variance`: exact laws of the estimators' per-replicate outputs.
"""

from kvdrift.finite.exact import ExactRisk, exact, exact_rho
from kvdrift.finite.pair import FinitePair, FinitePath, History, ProbFn
from kvdrift.finite.systems import extremal_pair, paper_system, random_pair

__all__ = ["ExactRisk", "FinitePair", "FinitePath", "History", "ProbFn", "exact", "exact_rho",
           "extremal_pair", "paper_system", "random_pair"]
