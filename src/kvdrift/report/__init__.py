"""The study report: figures, a self-contained HTML page, and a terminal summary.

Input is a study analysis, a :class:`~kvdrift.analysis.results.StudyAnalysis` (from
:func:`kvdrift.analysis.study.analyze` or
:meth:`kvdrift.directory.StudyDirectory.analyze`); ``analysis.json`` is its ``to_json()``.

Fractions are stored in [0, 1] and shown in percent; differences in percentage points.
"""

from kvdrift.report.html import write_report
from kvdrift.report.terminal import summary_table

__all__ = ["summary_table", "write_report"]
