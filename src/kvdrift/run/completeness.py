"""Whether a store holds every unit its configuration names, and whether it is being written.

``kvdrift report`` on a store that a run is still writing (or that an interrupted run left)
analyses the finished units only; :func:`completeness` says so, naming the missing units, so a
partial report never passes for a whole one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvdrift.output import OutputDir
from kvdrift.run.lock import StoreLock

#: How many missing units a note names before it counts the rest.
SHOWN = 5


@dataclass(frozen=True)
class Completeness:
    """What a store lacks: ``writer`` is the PID of a process writing it now (else None);
    ``missing`` the units (model · document · action) not finished among the documents that
    have at least one finished unit; ``finished`` how many are."""

    writer: str | None
    finished: int
    missing: tuple[str, ...]

    @property
    def partial(self) -> bool:
        return self.writer is not None or bool(self.missing)

    def note(self, root: Path) -> str | None:
        """One line saying the analysis is partial and why, or None for a whole store."""
        if not self.partial:
            return None
        shown = ", ".join(self.missing[:SHOWN])
        more = len(self.missing) - SHOWN
        missing = (f"; missing: {shown}" + (f" and {more} more" if more > 0 else "")
                   if self.missing else "")
        if self.writer is not None:
            return (f"partial report: {root} is being written by another kvdrift process (PID "
                    f"{self.writer}); {self.finished} units finished so far{missing} (documents "
                    "not started yet are not listed); pass --wait to report once it finishes")
        return (f"partial report: {self.finished} units finished{missing}; run the same run or "
                "study command again to finish them")


def _names(config: Mapping[str, Any], key: str) -> list[str]:
    value = config.get(key)
    return [str(v) for v in value] if isinstance(value, list) else []


def completeness(root: str | Path | OutputDir, config: Mapping[str, Any],
                 done: Iterable[tuple[str, str, str]]) -> Completeness:
    """How complete the store at ``root`` is, given its config and its finished units'
    (model, doc_id, action) keys."""
    done = set(done)
    models = _names(config, "models") or sorted({m for m, _, _ in done})
    actions = _names(config, "actions") or sorted({a for _, _, a in done})
    docs = list(dict.fromkeys(d for _, d, _ in sorted(done)))
    missing = tuple(f"{m} · {d} · {a}" for m in models for d in docs for a in actions
                    if (m, d, a) not in done)
    return Completeness(StoreLock(root).holder(), len(done), missing)
