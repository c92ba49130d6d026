"""Analyse a run or study directory with the analysis options saved in it."""

from __future__ import annotations

from pathlib import Path

from kvdrift.analysis.results import StudyAnalysis
from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.run.store import RunStore


def saved_options(config: dict, bootstrap: int | None = None,
                  alpha: float | None = None) -> AnalysisOptions:
    """The options a run's config saved (a plain run saves none: defaults), with overrides."""
    saved = dict(config.get("analysis", {}))
    saved["endpoints"] = tuple(saved.get("endpoints", ()))
    overrides = {k: v for k, v in (("bootstrap", bootstrap), ("alpha", alpha)) if v is not None}
    return AnalysisOptions(**(saved | overrides))


def analyze_directory(path: str | Path, bootstrap: int | None = None,
                      alpha: float | None = None) -> StudyAnalysis:
    """Analyse the records of a run or study directory.

    Parameters
    ----------
    path : path
        A directory written by ``kvdrift run`` or ``kvdrift study``.
    bootstrap, alpha : optional
        Override the bootstrap draws and the interval level saved with the study.

    Returns
    -------
    StudyAnalysis
        Its meta holds the run's config, package versions and temperature.
    """
    store = RunStore(Path(path))
    meta = store.metadata
    config = meta["config"]
    return analyze(store.read("steps").to_pandas(), store.read("replicates").to_pandas(),
                   saved_options(config, bootstrap, alpha),
                   meta={"config": config, "versions": meta["versions"],
                         "temperature": config.get("temperature")})
