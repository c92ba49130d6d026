"""What a study analysis returns: small frozen objects, read by the report and the CLI.

:func:`kvdrift.analysis.study.analyze` returns a :class:`StudyAnalysis`. Every object has
``to_json()``, the exact structure ``analysis.json`` stores (NaN where a quantity is
undefined; the report writes it as null), and the tables have ``to_frame()``: a pandas
DataFrame with one row per model x action (x stratum, or per model x contrast ``a - b``),
each quantity's estimate in a column named after it (``R``, ``O``, ``E``, ``Pi``, ``C``,
``F``, ...) and its interval in ``R_lo``, ``R_hi``. :meth:`StudyAnalysis.from_json` reads an
``analysis.json`` back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvdrift.analysis import registry
from kvdrift.analysis.endpoints import parse_endpoint
from kvdrift.analysis.interval import Interval, numbers
from kvdrift.analysis.lags import LagWindows
from kvdrift.analysis.readings import SpeculativeResult, TeacherForcedResult
from kvdrift.notebook import HtmlTable
from kvdrift.records.schema import RecordedEstimator, recorded_estimator


def interval_columns(intervals: Mapping[str, Interval]) -> dict[str, float]:
    """``{name: estimate, name_lo: lo, name_hi: hi}`` for each named interval."""
    out: dict[str, float] = {}
    for name, iv in intervals.items():
        out |= {name: iv.estimate, f"{name}_lo": iv.lo, f"{name}_hi": iv.hi}
    return out


def _frame(rows: Iterable[dict], columns: list[str]) -> pd.DataFrame:
    rows = list(rows)
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)


def _intervals_from_json(data: Mapping, keys: Iterable[str], level: float) -> dict[str, Interval]:
    """The named intervals of ``data``; a key whose value is null is left out (not measured)."""
    return {k: Interval.from_json(data[k], level) for k in keys if data[k] is not None}


@dataclass(frozen=True)
class Curve:
    """A curve over ``x`` with pointwise intervals (``blocks``: position ranges of a block gap)."""

    x: tuple[int, ...]
    estimate: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    level: float
    blocks: tuple[tuple[int, int], ...] | None = None

    def to_json(self) -> dict:
        out = {"x": list(self.x), "estimate": list(self.estimate), "lo": list(self.lo),
               "hi": list(self.hi)}
        if self.blocks is not None:
            out["blocks"] = [[s, e] for s, e in self.blocks]
        return out

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> Curve:
        n = len(data["x"])
        columns = [tuple(numbers(data[k])) if data.get(k) is not None and len(data[k]) == n
                   else (float("nan"),) * n for k in ("estimate", "lo", "hi")]
        blocks = data.get("blocks")
        return cls(tuple(int(v) for v in data["x"]), *columns, level,
                   None if blocks is None else tuple((int(s), int(e)) for s, e in blocks))


@dataclass(frozen=True)
class Bound:
    """Depth ``L``: the sharp set ``[R_L, R_L + B_L]`` and its Hoeffding enclosure."""

    L: int
    sharp: Interval
    hoeffding: Interval

    @property
    def R_L(self) -> float:  # noqa: N802
        return self.sharp.lo

    @property
    def B_L(self) -> float:  # noqa: N802
        return self.sharp.hi - self.sharp.lo

    def to_json(self) -> dict:
        return {"L": self.L, "R_L": self.R_L, "B_L": self.B_L, "lo": self.sharp.lo,
                "hi": self.sharp.hi, "minimax": self.sharp.minimax,
                "hoeffding_lo": self.hoeffding.lo, "hoeffding_hi": self.hoeffding.hi}

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> Bound:
        return cls(int(data["L"]), Interval.enclosing(data["lo"], data["hi"]),
                   Interval.enclosing(data["hoeffding_lo"], data["hoeffding_hi"], level))


@dataclass(frozen=True)
class EosSplit:
    """One action's ``R``, ``F`` and ``G_r = (R - F)_r`` per EOS category (docs/method.md
    section 8)."""

    categories: tuple[str, ...]
    R: tuple[float, ...]
    F: tuple[float, ...]
    R_minus_F: tuple[float, ...]
    G: tuple[Interval, ...]
    G_total: Interval

    def to_json(self) -> dict:
        return {"categories": list(self.categories), "R": list(self.R), "F": list(self.F),
                "R_minus_F": list(self.R_minus_F), "G": [g.to_json() for g in self.G],
                "G_total": self.G_total.to_json()}

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> EosSplit:
        G = tuple(Interval.from_json(g, level) for g in data.get("G") or ())
        gaps = numbers(data["R_minus_F"])
        nan = float("nan")
        total = (Interval.from_json(data["G_total"], level) if data.get("G_total") else
                 Interval(float(np.nansum(gaps)), nan, nan, level))  # no interval stored
        return cls(tuple(str(c) for c in data["categories"]), tuple(numbers(data["R"])),
                   tuple(numbers(data["F"])), tuple(gaps), G, total)


@dataclass(frozen=True)
class ActionResult:
    """One model x action: every scalar with its interval, curves, EOS split and bounds.

    ``kv_bytes`` and ``kv_fraction``: Q's prompt cache in bytes and as a fraction of the full
    cache in the model's dtype, weighted means over the documents
    (:mod:`kvdrift.analysis.memory`); NaN where the records do not tell it (finite pairs,
    stores written before the columns existed). Point values: the cache size is set by the
    action and the documents, so no interval. ``kv_bytes_generation`` and
    ``kv_fraction_generation``: Q's whole cache (prompt and generated entries) averaged over the
    generation, the measure a decoding-time press bounds; ``compressions``: the positions first
    computed from a cache a decoding-time press compressed (any document;
    :mod:`kvdrift.records.generation`).
    """

    model: str
    action: str
    documents: int
    scalars: Mapping[str, Interval]
    curves: Mapping[str, Curve] = field(default_factory=dict)
    eos_split: EosSplit | None = None
    bounds: tuple[Bound, ...] = ()
    kv_bytes: float = float("nan")
    kv_fraction: float = float("nan")
    kv_bytes_generation: float = float("nan")
    kv_fraction_generation: float = float("nan")
    compressions: tuple[int, ...] = ()

    def to_json(self) -> dict:
        return {"model": self.model, "action": self.action, "documents": self.documents,
                "kv_bytes": self.kv_bytes, "kv_fraction": self.kv_fraction,
                "kv_bytes_generation": self.kv_bytes_generation,
                "kv_fraction_generation": self.kv_fraction_generation,
                "compressions": list(self.compressions),
                "scalars": {k: v.to_json() for k, v in self.scalars.items()},
                "curves": {k: v.to_json() for k, v in self.curves.items()},
                "eos_split": None if self.eos_split is None else self.eos_split.to_json(),
                "bounds": [b.to_json() for b in self.bounds]}

    def row(self) -> dict:
        return ({"model": self.model, "action": self.action, "kv_bytes": self.kv_bytes,
                 "kv_fraction": self.kv_fraction,
                 "kv_bytes_generation": self.kv_bytes_generation,
                 "kv_fraction_generation": self.kv_fraction_generation}
                | interval_columns(self.scalars))

    def to_frame(self) -> pd.DataFrame:
        """One row: ``model``, ``action``, ``kv_bytes``, ``kv_fraction`` and every scalar
        with ``_lo``/``_hi``."""
        return pd.DataFrame([self.row()])

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> ActionResult:
        split = data.get("eos_split")
        memory = {k: float("nan") if data.get(k) is None else float(data[k])
                  for k in ("kv_bytes", "kv_fraction", "kv_bytes_generation",
                            "kv_fraction_generation")}
        return cls(str(data["model"]), str(data["action"]), int(data["documents"]),
                   _intervals_from_json(data["scalars"], data["scalars"], level),
                   {k: Curve.from_json(v, level) for k, v in (data.get("curves") or {}).items()},
                   EosSplit.from_json(split, level) if split else None,
                   tuple(Bound.from_json(b, level) for b in data.get("bounds") or ()),
                   **memory, compressions=tuple(int(t) for t in data.get("compressions") or ()))


@dataclass(frozen=True)
class ContrastResult:
    """``a - b`` between two actions of a model (``a`` the later action, ``b`` the earlier):
    the decomposition terms, and the block gap (the generation clock) when both actions have
    ``E[delta_t]`` curves."""

    model: str
    a: str
    b: str
    terms: Mapping[str, Interval]
    block_gap: Curve | None = None

    def to_json(self, *, with_model: bool = True) -> dict:
        out = {"model": self.model} if with_model else {}
        out |= {"a": self.a, "b": self.b} | {k: v.to_json() for k, v in self.terms.items()}
        if self.block_gap is not None:
            out["block_gap"] = self.block_gap.to_json()
        return out

    def row(self) -> dict:
        return {"model": self.model, "a": self.a, "b": self.b} | interval_columns(self.terms)

    def to_frame(self) -> pd.DataFrame:
        """One row: ``model``, ``a``, ``b`` and every term (``dR``, ...) with ``_lo``/``_hi``."""
        return pd.DataFrame([self.row()])

    @classmethod
    def from_json(cls, data: Mapping, level: float, model: str | None = None) -> ContrastResult:
        keys = [k for k in data if k not in ("model", "a", "b", "block_gap")]
        gap = data.get("block_gap")
        return cls(str(data.get("model", model)), str(data["a"]), str(data["b"]),
                   _intervals_from_json(data, keys, level),
                   Curve.from_json(gap, level) if gap else None)


@dataclass(frozen=True)
class ActionScalars:
    """One action's scalars within a stratum."""

    action: str
    scalars: Mapping[str, Interval]

    def to_json(self) -> dict:
        return {"action": self.action, "scalars": {k: v.to_json() for k, v in
                                                   self.scalars.items()}}


@dataclass(frozen=True)
class StratumResult:
    """Every action's scalars and every contrast within one model x stratum."""

    model: str
    stratum: str
    documents: int
    actions: tuple[ActionScalars, ...]
    contrasts: tuple[ContrastResult, ...]
    task: tuple[TaskResult, ...] = ()  # task outcomes of the stratum's scored documents

    def to_json(self) -> dict:
        return {"model": self.model, "stratum": self.stratum, "documents": self.documents,
                "actions": [a.to_json() for a in self.actions],
                "contrasts": [c.to_json(with_model=False) for c in self.contrasts],
                "task": [t.to_json() for t in self.task]}

    def rows(self) -> list[dict]:
        return [{"model": self.model, "stratum": self.stratum, "documents": self.documents,
                 "action": a.action} | interval_columns(a.scalars) for a in self.actions]

    def to_frame(self) -> pd.DataFrame:
        """One row per action: ``model``, ``stratum``, ``documents``, ``action``, scalars."""
        return _frame(self.rows(), ["model", "stratum", "documents", "action"])

    def contrast_rows(self) -> list[dict]:
        return [{"model": self.model, "stratum": self.stratum, "a": c.a, "b": c.b}
                | interval_columns(c.terms) for c in self.contrasts]

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> StratumResult:
        model = str(data["model"])
        return cls(model, str(data["stratum"]), int(data["documents"]),
                   tuple(ActionScalars(str(a["action"]),
                                       _intervals_from_json(a["scalars"], a["scalars"], level))
                         for a in data.get("actions") or ()),
                   tuple(ContrastResult.from_json(c, level, model)
                         for c in data.get("contrasts") or ()),
                   tuple(TaskResult.from_json(t, level) for t in data.get("task") or ()))


@dataclass(frozen=True)
class EndpointResult:
    """A prespecified endpoint with its family-adjusted interval (level ``1 - alpha``)."""

    model: str
    name: str
    interval: Interval
    alpha: float

    @property
    def unit(self) -> str:
        """Its quantity's unit (:mod:`~kvdrift.analysis.registry`); a difference of
        percentages is in percentage points."""
        endpoint = parse_endpoint(self.name)
        unit = registry.quantity(endpoint.stat).unit
        return "pp" if unit == "%" and endpoint.minus is not None else unit

    def to_json(self) -> dict:
        return {"model": self.model, "name": self.name, **self.interval.to_json(),
                "alpha": self.alpha}

    @classmethod
    def from_json(cls, data: Mapping) -> EndpointResult:
        alpha = float(data["alpha"])
        return cls(str(data["model"]), str(data["name"]), Interval.from_json(data, 1 - alpha),
                   alpha)


@dataclass(frozen=True)
class CertifiedOrder:
    """At depth ``L``, ``better`` has lower risk than ``worse`` for every compatible pair."""

    model: str
    L: int
    better: str
    worse: str

    def to_json(self) -> dict:
        return {"model": self.model, "L": self.L, "better": self.better, "worse": self.worse}


@dataclass(frozen=True)
class EosContrast:
    """``a - b`` of the EOS split: ``dG`` per category, its sum, pre-EOS part and EOS share."""

    model: str
    a: str
    b: str
    categories: tuple[str, ...]
    dG: tuple[Interval, ...]
    dR_minus_F: Interval
    pre_eos: Interval
    eos_share: Interval

    def to_json(self) -> dict:
        return {"model": self.model, "a": self.a, "b": self.b,
                "categories": list(self.categories), "dG": [g.to_json() for g in self.dG],
                "dR_minus_F": self.dR_minus_F.to_json(), "pre_eos": self.pre_eos.to_json(),
                "eos_share": self.eos_share.to_json()}

    def row(self) -> dict:
        named = {f"dG_{r}": g for r, g in enumerate(self.dG)} | {
            "dR_minus_F": self.dR_minus_F, "pre_eos": self.pre_eos, "eos_share": self.eos_share}
        return {"model": self.model, "a": self.a, "b": self.b} | interval_columns(named)

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> EosContrast:
        return cls(str(data["model"]), str(data["a"]), str(data["b"]),
                   tuple(str(c) for c in data["categories"]),
                   tuple(Interval.from_json(g, level) for g in data["dG"]),
                   *(Interval.from_json(data[k], level)
                     for k in ("dR_minus_F", "pre_eos", "eos_share")))


@dataclass(frozen=True)
class TwoClocks:
    """The paper's Table 2 for the contrast ``a - b`` (:mod:`kvdrift.analysis.clocks`).

    ``stratum`` is ``"all"`` when pooled. ``g``: the generation-clock gap per position block
    (``blocks``, inclusive ranges), ``delta_g = g_last - g_first``; ``B_a``, ``B_b``: the
    branch clock ``B`` of each action, beside it.
    """

    model: str
    stratum: str
    a: str
    b: str
    blocks: tuple[tuple[int, int], ...]
    g: tuple[Interval, ...]
    delta_g: Interval
    B_a: Interval
    B_b: Interval

    def to_json(self) -> dict:
        return {"model": self.model, "stratum": self.stratum, "a": self.a, "b": self.b,
                "blocks": [[s, e] for s, e in self.blocks], "g": [g.to_json() for g in self.g],
                "delta_g": self.delta_g.to_json(), "B_a": self.B_a.to_json(),
                "B_b": self.B_b.to_json()}

    def row(self) -> dict:
        named = {f"g_{s}_{e}": g for (s, e), g in zip(self.blocks, self.g, strict=True)}
        named |= {"delta_g": self.delta_g, "B_a": self.B_a, "B_b": self.B_b}
        return ({"model": self.model, "stratum": self.stratum, "a": self.a, "b": self.b}
                | interval_columns(named))

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> TwoClocks:
        return cls(str(data["model"]), str(data["stratum"]), str(data["a"]), str(data["b"]),
                   tuple((int(s), int(e)) for s, e in data["blocks"]),
                   tuple(Interval.from_json(g, level) for g in data["g"]),
                   *(Interval.from_json(data[k], level) for k in ("delta_g", "B_a", "B_b")))


@dataclass(frozen=True)
class LocalAgreement:
    """Within the branch cohort: the share with a long agreement run, and with a relapse."""

    model: str
    action: str
    run_length: int
    max_entry: int
    agree_run: Interval
    relapse: Interval

    def to_json(self) -> dict:
        return {"model": self.model, "action": self.action, "run_length": self.run_length,
                "max_entry": self.max_entry, "agree_run": self.agree_run.to_json(),
                "relapse": self.relapse.to_json()}

    def row(self) -> dict:
        return ({"model": self.model, "action": self.action, "run_length": self.run_length,
                 "max_entry": self.max_entry}
                | interval_columns({"agree_run": self.agree_run, "relapse": self.relapse}))

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> LocalAgreement:
        return cls(str(data["model"]), str(data["action"]), int(data["run_length"]),
                   int(data["max_entry"]), Interval.from_json(data["agree_run"], level),
                   Interval.from_json(data["relapse"], level))


@dataclass(frozen=True)
class CohortSupport:
    """Documents and trajectories in the branch cohort ``1 <= tau <= max_entry``, of all."""

    model: str
    action: str
    max_entry: int
    documents: int
    documents_total: int
    trajectories: int
    trajectories_total: int

    def to_json(self) -> dict:
        return {"model": self.model, "action": self.action, "max_entry": self.max_entry,
                "documents": self.documents, "documents_total": self.documents_total,
                "trajectories": self.trajectories,
                "trajectories_total": self.trajectories_total}


TASK_STATS = ("acc_p", "acc_q", "diff", "flips_lost", "flips_gained", "se_coupled",
              "se_uncoupled")
"""Task-outcome quantities of one action (:mod:`kvdrift.analysis.task`)."""


@dataclass(frozen=True)
class TaskResult:
    """Task outcomes of one model x action (x stratum) over its ``documents`` scored documents.

    ``stats`` holds every name of :data:`TASK_STATS` as an interval: accuracy under P and Q,
    ``diff = acc_q - acc_p``, the flip rates (``flips_lost``: P right and Q wrong), and the
    standard error of ``diff`` as measured (coupled) and as two independent sets of K samples
    per document would give it (uncoupled).
    """

    model: str
    action: str
    documents: int
    stats: Mapping[str, Interval]

    def to_json(self) -> dict:
        return {"model": self.model, "action": self.action, "documents": self.documents} | {
            k: self.stats[k].to_json() for k in TASK_STATS}

    def row(self) -> dict:
        return ({"model": self.model, "action": self.action, "documents": self.documents}
                | interval_columns(self.stats))

    def to_frame(self) -> pd.DataFrame:
        """One row: ``model``, ``action``, ``documents`` and every stat with ``_lo``/``_hi``."""
        return pd.DataFrame([self.row()])

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> TaskResult:
        return cls(str(data["model"]), str(data["action"]), int(data["documents"]),
                   {k: Interval.from_json(data[k] or {}, level) for k in TASK_STATS})


@dataclass(frozen=True)
class TaskDivergence:
    """Accuracy difference by divergence time: ``E[s_Y - s_X | tau <= t]`` over ``t = 1..H``
    (``curve``) and ``P(tau <= t)`` (``p_diverged``). Branches that never diverge within H
    generate the same text, so their difference is exactly 0."""

    model: str
    action: str
    curve: Curve
    p_diverged: tuple[float, ...]

    def to_json(self) -> dict:
        return ({"model": self.model, "action": self.action} | self.curve.to_json()
                | {"p_diverged": list(self.p_diverged)})

    @classmethod
    def from_json(cls, data: Mapping, level: float) -> TaskDivergence:
        return cls(str(data["model"]), str(data["action"]), Curve.from_json(data, level),
                   tuple(numbers(data["p_diverged"])))


@dataclass(frozen=True)
class StudyMeta:
    """What was analysed: the caller's context (``run``: config, versions, temperature) and
    the analysis settings. ``documents`` counts the last model's documents per stratum."""

    estimator: str
    horizon: int
    replicates: int
    bootstrap: int
    alpha: float
    documents: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    run: Mapping[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> Mapping[str, Any] | None:
        return self.run.get("config")

    @property
    def records(self) -> RecordedEstimator:
        """What the analysed records hold (their estimator's)."""
        return recorded_estimator(self.estimator)

    @property
    def versions(self) -> Mapping[str, str]:
        return self.run.get("versions") or {}

    @property
    def temperature(self) -> float | None:
        return self.run.get("temperature")

    def to_json(self) -> dict:
        out = dict(self.run) | {"estimator": self.estimator, "horizon": self.horizon,
                                "replicates": self.replicates, "bootstrap": self.bootstrap,
                                "alpha": self.alpha, "documents": dict(self.documents)}
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> StudyMeta:
        own = ("estimator", "horizon", "replicates", "bootstrap", "alpha", "documents", "notes")
        return cls(str(data["estimator"]), int(data["horizon"]), int(data["replicates"]),
                   int(data["bootstrap"]), float(data["alpha"]),
                   {str(k): int(v) for k, v in (data.get("documents") or {}).items()},
                   tuple(str(n) for n in data.get("notes") or ()),
                   {k: v for k, v in data.items() if k not in own})


@dataclass(frozen=True, repr=False)  # a short repr: one line and the curated table
class StudyAnalysis(HtmlTable):
    """The whole study analysis (:func:`kvdrift.analysis.study.analyze`).

    ``to_frame()`` is the headline table; ``contrasts_frame()``, ``strata_frame()``,
    ``stratum_contrasts_frame()``, ``endpoints_frame()``, ``bounds_frame()``,
    ``eos_contrasts_frame()``, ``local_agreement_frame()``, ``cohort_support_frame()``,
    ``task_frame()``, ``stratum_task_frame()``, ``teacher_forced_frame()``,
    ``speculative_frame()`` and ``two_clocks_frame()`` the others. ``teacher_forced`` and
    ``speculative``
    (:mod:`kvdrift.analysis.readings`) hold one entry per model x action, their
    ``*_contrasts`` one per contrast ``a - b``; all are empty under SWRB (see ``meta.notes``).
    Every contrast is ``a - b`` (minuend first, as endpoints are written), ``a`` the later of
    two actions of a model and ``b`` the earlier.
    """

    meta: StudyMeta
    lags: LagWindows | None = None
    actions: tuple[ActionResult, ...] = ()
    contrasts: tuple[ContrastResult, ...] = ()
    endpoints: tuple[EndpointResult, ...] = ()
    certified_order: tuple[CertifiedOrder, ...] = ()
    strata: tuple[StratumResult, ...] = ()
    eos_contrasts: tuple[EosContrast, ...] = ()
    local_agreement: tuple[LocalAgreement, ...] = ()
    cohort_support: tuple[CohortSupport, ...] = ()
    task: tuple[TaskResult, ...] = ()
    task_by_divergence: tuple[TaskDivergence, ...] = ()
    teacher_forced: tuple[TeacherForcedResult, ...] = ()
    speculative: tuple[SpeculativeResult, ...] = ()
    teacher_forced_contrasts: tuple[TeacherForcedResult, ...] = ()
    speculative_contrasts: tuple[SpeculativeResult, ...] = ()
    two_clocks: tuple[TwoClocks, ...] = ()

    def _repr_html_(self) -> str:
        from kvdrift.notebook import curated_html

        return curated_html(self, "StudyAnalysis")

    def __repr__(self) -> str:
        from kvdrift.notebook import analysis_line, curated_frame

        table = curated_frame(self).to_string(index=False) if self.actions else ""
        return f"StudyAnalysis({analysis_line(self)})\n{table}".rstrip()

    @property
    def models(self) -> list[str]:
        """Models in the order they were analysed."""
        return list(dict.fromkeys(a.model for a in self.actions))

    def action(self, model: str, action: str) -> ActionResult:
        """The result of ``action`` on ``model``."""
        for a in self.actions:
            if (a.model, a.action) == (model, action):
                return a
        raise KeyError(f"no action {action!r} for model {model!r} in this analysis")

    def contrast(self, model: str, a: str, b: str) -> ContrastResult:
        """The contrast ``a - b`` on ``model`` (``a`` the later action, ``b`` the earlier)."""
        for c in self.contrasts:
            if (c.model, c.a, c.b) == (model, a, b):
                return c
        raise KeyError(f"no contrast {a} - {b} for model {model!r} in this analysis")

    def to_json(self) -> dict:
        """Exactly the structure of ``analysis.json`` (NaN where undefined)."""
        return {"meta": self.meta.to_json(),
                "lags": self.lags.as_dict() if self.lags is not None else None,
                "actions": [a.to_json() for a in self.actions],
                "contrasts": [c.to_json() for c in self.contrasts],
                "endpoints": [e.to_json() for e in self.endpoints],
                "certified_order": [o.to_json() for o in self.certified_order],
                "strata": [s.to_json() for s in self.strata],
                "eos_contrasts": [c.to_json() for c in self.eos_contrasts],
                "local_agreement": [x.to_json() for x in self.local_agreement],
                "cohort_support": [x.to_json() for x in self.cohort_support],
                "task": [x.to_json() for x in self.task],
                "task_by_divergence": [x.to_json() for x in self.task_by_divergence],
                "teacher_forced": [x.to_json() for x in self.teacher_forced],
                "speculative": [x.to_json() for x in self.speculative],
                "teacher_forced_contrasts": [x.to_json() for x in self.teacher_forced_contrasts],
                "speculative_contrasts": [x.to_json() for x in self.speculative_contrasts],
                "two_clocks": [x.to_json() for x in self.two_clocks]}

    def to_frame(self) -> pd.DataFrame:
        """One row per model x action: ``model``, ``action``, ``kv_bytes``, ``kv_fraction``,
        each scalar with ``_lo``/``_hi``."""
        return _frame((a.row() for a in self.actions), ["model", "action"])

    def contrasts_frame(self) -> pd.DataFrame:
        """One row per model x contrast ``a - b``: ``model``, ``a``, ``b``, each term."""
        return _frame((c.row() for c in self.contrasts), ["model", "a", "b"])

    def strata_frame(self) -> pd.DataFrame:
        """One row per model x stratum x action: ``model``, ``stratum``, ``documents``,
        ``action`` and each scalar."""
        return _frame((r for s in self.strata for r in s.rows()),
                      ["model", "stratum", "documents", "action"])

    def stratum_contrasts_frame(self) -> pd.DataFrame:
        """One row per model x stratum x contrast: ``model``, ``stratum``, ``a``, ``b``, terms."""
        return _frame((r for s in self.strata for r in s.contrast_rows()),
                      ["model", "stratum", "a", "b"])

    def endpoints_frame(self) -> pd.DataFrame:
        """One row per model x endpoint: ``model``, ``endpoint``, estimate, lo, hi, alpha."""
        return _frame(({"model": e.model, "endpoint": e.name, "estimate": e.interval.estimate,
                        "lo": e.interval.lo, "hi": e.interval.hi, "alpha": e.alpha}
                       for e in self.endpoints),
                      ["model", "endpoint", "estimate", "lo", "hi", "alpha"])

    def bounds_frame(self) -> pd.DataFrame:
        """One row per model x action x depth L, with the columns of ``bounds`` in the JSON."""
        return _frame(({"model": a.model, "action": a.action} | b.to_json()
                       for a in self.actions for b in a.bounds), ["model", "action", "L"])

    def eos_contrasts_frame(self) -> pd.DataFrame:
        """One row per model x contrast: ``dG_0..dG_3``, ``dR_minus_F``, ``pre_eos``,
        ``eos_share``, each with ``_lo``/``_hi``."""
        return _frame((c.row() for c in self.eos_contrasts), ["model", "a", "b"])

    def local_agreement_frame(self) -> pd.DataFrame:
        """One row per model x action: ``agree_run`` and ``relapse`` with ``_lo``/``_hi``."""
        return _frame((x.row() for x in self.local_agreement), ["model", "action"])

    def cohort_support_frame(self) -> pd.DataFrame:
        """One row per model x action: documents and trajectories in the branch cohort."""
        return _frame((x.to_json() for x in self.cohort_support), ["model", "action"])

    def task_frame(self) -> pd.DataFrame:
        """One row per model x action: scored ``documents`` and every task stat."""
        return _frame((x.row() for x in self.task), ["model", "action", "documents"])

    def stratum_task_frame(self) -> pd.DataFrame:
        """One row per model x stratum x action: task stats within the stratum."""
        return _frame(({"stratum": s.stratum} | t.row() for s in self.strata for t in s.task),
                      ["stratum", "model", "action", "documents"])

    def teacher_forced_frame(self) -> pd.DataFrame:
        """One row per model x action: ``kl``, ``top1``, ``dp``, ``ppl_ratio`` with intervals."""
        return _frame((x.row() for x in self.teacher_forced), ["model", "action"])

    def two_clocks_frame(self) -> pd.DataFrame:
        """One row per model x stratum (``all``: pooled) x contrast: ``g_<s>_<e>`` per block,
        ``delta_g``, ``B_a``, ``B_b``, each with ``_lo``/``_hi``."""
        return _frame((x.row() for x in self.two_clocks), ["model", "stratum", "a", "b"])

    def speculative_frame(self) -> pd.DataFrame:
        """One row per model x action: ``acceptance``, ``tokens_per_round_<gamma>`` and
        ``first_round_<k>`` with intervals."""
        return _frame((x.row() for x in self.speculative), ["model", "action"])

    @classmethod
    def from_json(cls, data: Mapping) -> StudyAnalysis:
        """Read the structure :meth:`to_json` writes (an ``analysis.json``; null: NaN)."""
        meta = StudyMeta.from_json(data["meta"])
        level = 1 - meta.alpha
        lags = data.get("lags")
        return cls(
            meta,
            None if not lags else LagWindows(int(lags["max_entry"]), len(lags["lags"]),
                                                 tuple(lags["early"]), tuple(lags["late"])),
            tuple(ActionResult.from_json(a, level) for a in data.get("actions") or ()),
            tuple(ContrastResult.from_json(c, level) for c in data.get("contrasts") or ()),
            tuple(EndpointResult.from_json(e) for e in data.get("endpoints") or ()),
            tuple(CertifiedOrder(str(o["model"]), int(o["L"]), str(o["better"]),
                                 str(o["worse"])) for o in data.get("certified_order") or ()),
            tuple(StratumResult.from_json(s, level) for s in data.get("strata") or ()),
            tuple(EosContrast.from_json(c, level) for c in data.get("eos_contrasts") or ()),
            tuple(LocalAgreement.from_json(x, level) for x in data.get("local_agreement") or ()),
            tuple(CohortSupport(**x) for x in data.get("cohort_support") or ()),
            tuple(TaskResult.from_json(x, level) for x in data.get("task") or ()),
            tuple(TaskDivergence.from_json(x, level)
                  for x in data.get("task_by_divergence") or ()),
            *(tuple(kind.from_json(x, level) for x in data.get(key) or ())
              for key, kind in (("teacher_forced", TeacherForcedResult),
                                ("speculative", SpeculativeResult),
                                ("teacher_forced_contrasts", TeacherForcedResult),
                                ("speculative_contrasts", SpeculativeResult))),
            tuple(TwoClocks.from_json(x, level) for x in data.get("two_clocks") or ()),
        )
