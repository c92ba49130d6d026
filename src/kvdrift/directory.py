"""A run or study directory read back: its recorded configuration, its records, and what is
concluded from them (``analyze``, ``predict``, ``plan``).

This is where ``run/`` (the store that wrote the directory) meets ``analysis/`` (which turns
records into conclusions), so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import pandas as pd

from kvdrift.analysis.plan import STEP_COLUMNS, PlanResult, needs_steps, plan_study
from kvdrift.analysis.predict import PredictionResult, predict_study
from kvdrift.analysis.results import StudyAnalysis
from kvdrift.analysis.study import CONFIRMATORY_DRAWS, AnalysisOptions, analyze
from kvdrift.run.completeness import completeness
from kvdrift.run.documents import RecordedDocument, read_documents
from kvdrift.run.lock import StoreLock
from kvdrift.run.store import RunStore
from kvdrift.study_config import StudyConfig, recorded_study


@dataclass(frozen=True)
class Records:
    """A run or study directory's records as pandas DataFrames, with its configuration.

    ``steps``: one row per (model, document, action, replicate, position t);
    ``replicates``: one row per (model, document, action, replicate). The columns are
    declared, with their types and meaning, in :mod:`kvdrift.records.schema`.
    """

    steps: pd.DataFrame
    replicates: pd.DataFrame
    config: dict
    versions: dict

    def __repr__(self) -> str:
        return (f"Records(steps: {len(self.steps):,} rows, replicates: "
                f"{len(self.replicates):,} rows)")


PREDICT_STEP_COLUMNS = ["model", "doc_id", "stratum", "action", "replicate", "t", "mismatch",
                        "x_eos", "y_eos", "delta"]
PREDICT_REPLICATE_COLUMNS = ["model", "doc_id", "stratum", "action", "replicate", "estimator",
                             "horizon", "risk", "fixed_risk", "tau"]
"""The columns ``predict`` reads from each cohort."""


class StudyDirectory:
    """A directory written by ``kvdrift run`` or ``kvdrift study`` (or :func:`run_units`
    into a :class:`~kvdrift.run.store.RunStore`), read back.

    ``config`` is the configuration it recorded, as recorded; ``study`` the same parsed back
    into a :class:`~kvdrift.study_config.StudyConfig` (None for a store of units run without
    a study); ``options`` the analysis options it saved.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.store = RunStore(self.path)

    @cached_property
    def _metadata(self) -> dict:
        return self.store.metadata

    @property
    def config(self) -> dict:
        return self._metadata["config"]

    @property
    def versions(self) -> dict:
        return self._metadata["versions"]

    @cached_property
    def study(self) -> StudyConfig | None:
        return recorded_study(self.config)

    @property
    def temperature(self) -> float | None:
        return self.config.get("temperature")

    @property
    def cohort(self) -> str | None:
        return self.config.get("cohort")

    def options(self, bootstrap: int | None = None,
                alpha: float | None = None) -> AnalysisOptions:
        """The analysis options the directory saved (a plain run saves none: defaults),
        with overrides."""
        options = AnalysisOptions.from_table(self.config.get("analysis", {}))
        overrides = {k: v for k, v in (("bootstrap", bootstrap), ("alpha", alpha))
                     if v is not None}
        return replace(options, **overrides) if overrides else options

    def records(self, steps: list[str] | None = None,
                replicates: list[str] | None = None) -> Records:
        """Every finished unit's records (optionally some columns)."""
        return Records(steps=self.store.read("steps", steps).to_pandas(),
                       replicates=self.store.read("replicates", replicates).to_pandas(),
                       config=self.config, versions=self.versions)

    @cached_property
    def documents(self) -> dict[tuple[str, str], RecordedDocument] | None:
        """What the units ran on, by (model, document id) (:mod:`kvdrift.run.documents`);
        None for a store written before documents were recorded."""
        return read_documents(self.path)

    def unit_fingerprint(self, model: str, doc_id: str, action: str) -> dict | None:
        """The settings a finished unit was stored with (:mod:`kvdrift.run.fingerprint`), or
        None where its file holds none."""
        import pyarrow.parquet as pq

        from kvdrift.run import fingerprint
        from kvdrift.run.records import UnitKey
        from kvdrift.run.store import unit_name

        name = f"{unit_name(UnitKey(model, doc_id, action))}.parquet"
        with self.store.open_part("replicates", name) as handle:  # a regular file, held folder
            return fingerprint.decode(pq.read_schema(handle).metadata)

    def analyze(self, bootstrap: int | None = None, alpha: float | None = None,
                wait: bool = False) -> StudyAnalysis:
        """The study analysis of the records.

        Parameters
        ----------
        bootstrap, alpha : optional
            Override the bootstrap draws and the interval level saved with the study.
        wait : bool
            Wait for a run that is writing the directory to finish first.

        Returns
        -------
        StudyAnalysis
            Its meta holds the run's config, package versions and temperature. A partial
            store (being written, or units missing) adds a note naming the missing units,
            and ``meta.run["partial"]`` with the writer's PID and the missing units.
        """
        if wait:
            StoreLock(self.store.dir).wait()
        config = self.config
        replicates = self.store.read("replicates").to_pandas()
        state = completeness(self.store.dir, config, zip(
            replicates["model"], replicates["doc_id"], replicates["action"], strict=True))
        run = {"config": config, "versions": self.versions, "temperature": self.temperature}
        if state.partial:
            run["partial"] = {"writer": state.writer, "missing": list(state.missing)}
        steps = self.store.read("steps").to_pandas()
        if state.writer is not None:  # units finished after the replicates were read: not yet
            unit = ["model", "doc_id", "action"]
            steps = steps[pd.MultiIndex.from_frame(steps[unit]).isin(
                pd.MultiIndex.from_frame(replicates[unit]))]
        analysis = analyze(steps, replicates, self.options(bootstrap, alpha), meta=run)
        note = state.note(self.store.root)
        if note is None:
            return analysis
        return replace(analysis, meta=replace(analysis.meta, notes=(note, *analysis.meta.notes)))

    def cohort_records(self, role: str) -> Records:
        """The records ``predict`` reads from a cohort; refuses a run labelled the other."""
        if self.cohort is not None and self.cohort != role:
            raise ValueError(f"{self.path} is the {self.cohort} cohort ([study] cohort = "
                             f"{self.cohort!r}); pass a {role} run here")
        return self.records(PREDICT_STEP_COLUMNS, PREDICT_REPLICATE_COLUMNS)

    def predict(self, evaluation: StudyDirectory, contrast: str, *, window: int = 32,
                margin: float = 0.02, alpha: float = 0.05, draws: int = CONFIRMATORY_DRAWS,
                seed: int = 0, target: str = "tv",
                on_cell: Callable[[str, str], None] | None = None) -> PredictionResult:
        """:func:`~kvdrift.analysis.predict.predict_study` with this directory as the
        development cohort and ``evaluation`` as the evaluation one (their recorded
        temperatures must agree)."""
        d, e = self.cohort_records("development"), evaluation.cohort_records("evaluation")
        return predict_study((d.steps, d.replicates), (e.steps, e.replicates), contrast,
                             window=window, margin=margin, alpha=alpha, draws=draws, seed=seed,
                             target=target, on_cell=on_cell,
                             temperatures=(self.temperature, evaluation.temperature))

    def plan(self, target: str, halfwidth: float, alpha: float = 0.05,
             endpoints: int = 1) -> PlanResult:
        """:func:`~kvdrift.analysis.plan.plan_study` on this (development) directory's
        records (its step records too when the target is ``S99``)."""
        steps = (self.store.read("steps", STEP_COLUMNS).to_pandas() if needs_steps(target)
                 else None)
        return plan_study(self.store.read("replicates").to_pandas(), target, halfwidth, alpha,
                          endpoints, steps)
