"""What ``kvdrift.measure`` returns: a run's records and their analysis, held in memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvdrift.analysis.results import StudyAnalysis
from kvdrift.directory import Records
from kvdrift.notebook import HtmlTable


@dataclass(frozen=True, repr=False)  # a short repr: the analysis's line and table
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
        """The analysis's table: one row per model x action, every quantity with ``_lo`` and
        ``_hi`` columns (numbers; a notebook shows them curated)."""
        return self.analysis.to_frame()

    def _repr_html_(self) -> str:
        from kvdrift.notebook import curated_html

        where = "in memory" if self.out is None else str(self.out)
        return curated_html(self.analysis, f"Measurement ({where})")

    def __repr__(self) -> str:
        from kvdrift.notebook import analysis_line, curated_frame

        where = "in memory" if self.out is None else f"stored in {self.out}"
        table = curated_frame(self.analysis).to_string(index=False)
        return f"Measurement({analysis_line(self.analysis)}; {where})\n{table}".rstrip()

    def to_json(self) -> dict:
        return self.analysis.to_json()
