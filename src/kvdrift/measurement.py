"""What ``kvdrift.measure`` returns: a run's records and their analysis, held in memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvdrift.analysis.results import StudyAnalysis
from kvdrift.directory import Records
from kvdrift.notebook import HtmlTable


@dataclass(frozen=True)
class Measurement(HtmlTable):
    """The records of a run (``records.steps``, ``records.replicates``: DataFrames) and their
    analysis; ``out`` is the folder they were stored in, or None (nothing was written).

    ``to_frame()`` is the analysis's table (one row per model x action), which a notebook
    shows; ``to_json()`` the analysis as ``analysis.json`` holds it.
    """

    records: Records
    analysis: StudyAnalysis
    out: Path | None = None

    def to_frame(self) -> pd.DataFrame:
        return self.analysis.to_frame()

    def to_json(self) -> dict:
        return self.analysis.to_json()
