"""The names of the task metrics (RULER's), readable by both documents and scoring.

``document.py`` checks a document's ``meta["metric"]`` against these names and
``scoring.py`` maps each name to its function; keeping the names here lets a document be
checked without importing how it is scored.
"""

from __future__ import annotations

STRING_MATCH_ALL = "string_match_all"
STRING_MATCH_PART = "string_match_part"
FINAL_ANSWER = "final_answer"

METRIC_NAMES: tuple[str, ...] = (STRING_MATCH_ALL, STRING_MATCH_PART, FINAL_ANSWER)
