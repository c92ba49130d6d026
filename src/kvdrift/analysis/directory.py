"""Analyses of run and study directories: the study analysis with its saved options,
the records as DataFrames, and ``predict``/``plan`` on directories."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from kvdrift.analysis.plan import STEP_COLUMNS, PlanResult, needs_steps, plan_study
from kvdrift.analysis.predict import PredictionResult, predict_study
from kvdrift.analysis.results import StudyAnalysis
from kvdrift.analysis.study import CONFIRMATORY_DRAWS, AnalysisOptions, analyze
from kvdrift.run.completeness import completeness
from kvdrift.run.lock import StoreLock
from kvdrift.run.store import RunStore


def saved_options(config: dict, bootstrap: int | None = None,
                  alpha: float | None = None) -> AnalysisOptions:
    """The options a run's config saved (a plain run saves none: defaults), with overrides."""
    saved = dict(config.get("analysis", {}))
    saved["endpoints"] = tuple(saved.get("endpoints", ()))
    overrides = {k: v for k, v in (("bootstrap", bootstrap), ("alpha", alpha)) if v is not None}
    return AnalysisOptions(**(saved | overrides))


def analyze_directory(path: str | Path, bootstrap: int | None = None,
                      alpha: float | None = None, wait: bool = False) -> StudyAnalysis:
    """Analyse the records of a run or study directory.

    Parameters
    ----------
    path : path
        A directory written by ``kvdrift run`` or ``kvdrift study``.
    bootstrap, alpha : optional
        Override the bootstrap draws and the interval level saved with the study.
    wait : bool
        Wait for a run that is writing the directory to finish first.

    Returns
    -------
    StudyAnalysis
        Its meta holds the run's config, package versions and temperature. A partial store
        (being written, or units missing) adds a note naming the missing units, and
        ``meta.run["partial"]`` with the writer's PID and the missing units.
    """
    store = RunStore(Path(path))
    if wait:
        StoreLock(store.root).wait()
    meta = store.metadata
    config = meta["config"]
    replicates = store.read("replicates").to_pandas()
    state = completeness(store.root, config, zip(replicates["model"], replicates["doc_id"],
                                                 replicates["action"], strict=True))
    run = {"config": config, "versions": meta["versions"],
           "temperature": config.get("temperature")}
    if state.partial:
        run["partial"] = {"writer": state.writer, "missing": list(state.missing)}
    steps = store.read("steps").to_pandas()
    if state.writer is not None:  # units finished after the replicates were read: not yet
        unit = ["model", "doc_id", "action"]
        steps = steps[pd.MultiIndex.from_frame(steps[unit]).isin(
            pd.MultiIndex.from_frame(replicates[unit]))]
    analysis = analyze(steps, replicates, saved_options(config, bootstrap, alpha), meta=run)
    note = state.note(store.root)
    if note is None:
        return analysis
    return replace(analysis, meta=replace(analysis.meta, notes=(note, *analysis.meta.notes)))


@dataclass(frozen=True)
class Records:
    """A run or study directory's records as pandas DataFrames, with its configuration.

    ``steps``: one row per (model, document, action, replicate, position t);
    ``replicates``: one row per (model, document, action, replicate). Column meanings are
    listed in the README ("Records").
    """

    steps: pd.DataFrame
    replicates: pd.DataFrame
    config: dict
    versions: dict


def load_records(path: str | Path, steps: list[str] | None = None,
                 replicates: list[str] | None = None) -> Records:
    """Every finished unit's records of a run or study directory (optionally some columns)."""
    store = RunStore(Path(path))
    meta = store.metadata
    return Records(steps=store.read("steps", steps).to_pandas(),
                   replicates=store.read("replicates", replicates).to_pandas(),
                   config=meta["config"], versions=meta["versions"])


PREDICT_STEP_COLUMNS = ["model", "doc_id", "stratum", "action", "replicate", "t", "mismatch",
                        "x_eos", "y_eos", "delta"]
PREDICT_REPLICATE_COLUMNS = ["model", "doc_id", "stratum", "action", "replicate", "estimator",
                             "horizon", "risk", "fixed_risk", "tau"]


def cohort_records(path: str | Path, role: str) -> Records:
    """The records ``predict`` reads from a cohort; refuses a run labelled the other cohort."""
    records = load_records(path, PREDICT_STEP_COLUMNS, PREDICT_REPLICATE_COLUMNS)
    cohort = records.config.get("cohort")
    if cohort is not None and cohort != role:
        raise ValueError(f"{path} is the {cohort} cohort ([study] cohort = {cohort!r}); "
                         f"pass a {role} run here")
    return records


def predict_directories(dev: str | Path, evaluation: str | Path, contrast: str, *,
                        window: int = 32, margin: float = 0.02, alpha: float = 0.05,
                        draws: int = CONFIRMATORY_DRAWS, seed: int = 0, target: str = "tv",
                        on_cell: Callable[[str, str], None] | None = None) -> PredictionResult:
    """:func:`~kvdrift.analysis.predict.predict_study` on a development and an evaluation
    directory (their temperatures are read from their configurations and must agree)."""
    d, e = cohort_records(dev, "development"), cohort_records(evaluation, "evaluation")
    return predict_study((d.steps, d.replicates), (e.steps, e.replicates), contrast,
                         window=window, margin=margin, alpha=alpha, draws=draws, seed=seed,
                         target=target, on_cell=on_cell, temperatures=(d.config.get("temperature"),
                                                        e.config.get("temperature")))


def plan_directory(dev: str | Path, target: str, halfwidth: float,
                   alpha: float = 0.05, endpoints: int = 1) -> PlanResult:
    """:func:`~kvdrift.analysis.plan.plan_study` on a development directory's records (its
    step records too when the target is ``S99``)."""
    store = RunStore(Path(dev))
    steps = store.read("steps", STEP_COLUMNS).to_pandas() if needs_steps(target) else None
    return plan_study(store.read("replicates").to_pandas(), target, halfwidth, alpha,
                      endpoints, steps)
