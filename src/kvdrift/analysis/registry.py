"""The registry of quantities: one entry per statistic of an action.

An entry names the statistic, gives its formula over an action's weighted feature means
(:class:`Means`: the point estimate, or every bootstrap draw at once), its unit and labels,
and says which analyses take it: study endpoints and ``plan``/``predict`` targets
(``STAT(action)``, :mod:`kvdrift.analysis.endpoints`), ``kvdrift plan`` (the replicate
columns whose per-replicate values it sizes a study with), the report's headline table and
the terminal summary. Every reader (``derive``, the endpoint grammar, ``plan``, the report,
the terminal) reads :data:`QUANTITIES`, so adding a quantity is one entry here plus its
formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvdrift import checks
from kvdrift.analysis.lags import LagWindows


def ratio(num: np.ndarray, den: np.ndarray, defined: np.ndarray | None = None) -> np.ndarray:
    """``num / den`` where ``defined`` (default: ``den > 0``), NaN elsewhere (undefined)."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    out = np.full(np.broadcast_shapes(num.shape, den.shape), np.nan)
    return np.divide(num, den, out=out, where=den > 0 if defined is None else defined)


@dataclass(frozen=True)
class Means:
    """An action's weighted means of per-document features, ``{name: [..., k]}`` (leading
    axes: bootstrap draws, or none for the point estimate), and the lag windows of ``B``."""

    features: dict[str, np.ndarray]
    windows: LagWindows | None = None

    @property
    def lead(self) -> tuple[int, ...]:
        return self.features["risk"].shape[:-1]

    def __getitem__(self, name: str) -> np.ndarray:
        """A scalar feature's mean (``[...]``); NaN when the records lack it."""
        if name not in self.features:
            return np.full(self.lead, np.nan)
        return self.features[name][..., 0]

    def window_gap(self, suffix: str = "") -> np.ndarray:
        """``B`` (``suffix=""``) or ``B_strict`` (``"_strict"``) over the lag windows."""
        num, den = f"lag_num{suffix}", f"lag_den{suffix}"
        if self.windows is None or num not in self.features:
            return np.full(self.lead, np.nan)
        return self.windows.window_gap(self.features[num], self.features[den])


@dataclass(frozen=True)
class Quantity:
    """One statistic of an action.

    ``unit`` is ``"%"`` (a fraction of positions or of trajectories), ``"pp"`` (a difference
    of fractions), ``"steps"``, or ``""`` (a variance or a ratio, not shown in tables); the
    first two are multiplied by 100 for display. ``html``/``text`` are its column headers
    (``{H}`` is replaced by the horizon). ``endpoint``: the endpoint grammar takes
    ``STAT(action)``; ``plan``: the replicate columns whose per-replicate value (the first
    minus the second, if two) ``kvdrift plan`` sizes it from (empty: plan does not take it);
    ``rollouts_only``: SWRB records cannot give it; ``from_steps``: its per-replicate value
    comes from the step records; ``headline``/``summary``: a column of the report's
    headline table / of the terminal summary; ``description``: what it is, in words.
    """

    name: str
    formula: Callable[[Means], np.ndarray]
    unit: str
    html: str
    text: str
    digits: int = 2
    endpoint: bool = True
    plan: tuple[str, ...] = ()
    rollouts_only: bool = False
    from_steps: bool = False
    headline: bool = True
    summary: bool = False
    description: str = ""

    @property
    def scale(self) -> float:
        return unit_scale(self.unit)


def unit_scale(unit: str) -> float:
    """What a value in ``unit`` is multiplied by to be shown: 100 for ``%`` and ``pp``."""
    return 100.0 if unit in ("%", "pp") else 1.0


def _variance_ratio(m: Means) -> np.ndarray:
    return ratio(m["risk_var"], m["risk_tv_var"])


def _rate(m: Means) -> np.ndarray:
    exposure = m["exposure"]
    return np.where(exposure > 0, ratio(m["occupation"], exposure), 0.0)


QUANTITIES: tuple[Quantity, ...] = (
    Quantity("p_diverge", lambda m: m["divergence_mass"], "%", "P(&tau; &le; {H})", "P(τ≤{H})",
             plan=("divergence_mass",), summary=True),
    Quantity("mean_entry_time", lambda m: ratio(m["entry_time_mass"], m["divergence_mass"]),
             "steps", "mean entry time", "entry", 1),
    # The token-mismatch risk; the decomposition R = O + E C is on it.
    Quantity("R", lambda m: m["occurrence"] + m["occupation"], "%", "R", "R",
             plan=("risk",), summary=True, description="token mismatch risk"),
    # The rollout-TV risk (1/H) sum_t E[delta_t]: R's expectation, never a larger variance.
    Quantity("R_tv", lambda m: m["risk_tv"], "%", "R<sub>TV</sub>", "R_TV",
             plan=("risk_tv",), rollouts_only=True, summary=True,
             description="rollout-TV risk"),
    Quantity("O", lambda m: m["occurrence"], "%", "O<sub>H</sub>", "O_H", plan=("occurrence",)),
    Quantity("E", lambda m: m["exposure"], "%", "E<sub>H</sub>", "E_H", plan=("exposure",),
             summary=True),
    Quantity("Pi", lambda m: m["occupation"], "%", "&Pi;<sub>H</sub>", "Π_H",
             plan=("occupation",)),
    Quantity("C", _rate, "%", "C<sub>H</sub>", "C_H", summary=True),
    Quantity("F", lambda m: m["fixed_risk"], "%", "F", "F", plan=("fixed_risk",),
             rollouts_only=True, description="fixed-history TV risk"),
    # As in the paper, R_TV - F, so that the EOS split sums to it.
    Quantity("R_minus_F", lambda m: m["risk_tv"] - m["fixed_risk"], "pp",
             "R<sub>TV</sub> &minus; F", "R_TV−F", plan=("risk_tv", "fixed_risk"),
             rollouts_only=True, summary=True),
    Quantity("S99", lambda m: m["saturation"], "%", "S<sub>.99</sub>", "S.99",
             plan=("saturation",), rollouts_only=True, from_steps=True),
    Quantity("B", lambda m: m.window_gap(), "pp", "B(a)", "B(a)", summary=True),
    # Shown after the headline columns only when some action has it.
    Quantity("B_strict", lambda m: m.window_gap("_strict"), "pp", "B(a) strict pre-EOS",
             "B strict", headline=False),
    # Within-document variance of one replicate's value, averaged over documents (strata
    # equally weighted), and var_R / var_R_tv.
    Quantity("var_R", lambda m: m["risk_var"], "", "var R", "var R", endpoint=False,
             headline=False),
    Quantity("var_R_tv", lambda m: m["risk_tv_var"], "", "var R<sub>TV</sub>", "var R_TV",
             endpoint=False, headline=False),
    Quantity("var_ratio", _variance_ratio, "", "var R / var R<sub>TV</sub>",
             "var R / var R_TV", endpoint=False, headline=False),
)
"""Every statistic of an action, in the order ``analysis.json`` lists them."""


def quantity(name: str) -> Quantity:
    """The registry's entry named ``name``."""
    entries = {q.name: q for q in QUANTITIES}
    return entries[checks.choice(name, "quantity", entries)]
