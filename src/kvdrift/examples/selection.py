"""Which replicates to show: the examples rule.

For each (model, action), among its replicates in the order (document, replicate):

- **earliest**: the replicate that diverged first (smallest tau >= 1), the first such in
  that order;
- **median**: among the replicates that diverged, sorted by tau (then document, replicate),
  the one at the lower median, ``(n - 1) // 2`` (the earliest again when only one diverged;
  then it is shown once);
- **never** (the report's examples only): the first replicate that never diverged
  (tau = 0), if any.

An action none of whose replicates diverged (``full``) is shown by its first replicate
(role "never") instead, so that every action has an example.

For SWRB records tau is the scan length J (never 0), so "diverged" is every replicate and
the rule orders them by J.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvdrift import checks

ROLES = ("earliest", "median", "never")
SHOW_ROLES = ("earliest", "median")
"""``kvdrift show``'s default: the earliest and the median divergence of each action."""


@dataclass(frozen=True)
class Example:
    """One replicate chosen to show, and why (``role``: one of :data:`ROLES`, or
    ``"chosen"`` where the user named it)."""

    model: str
    doc_id: str
    action: str
    replicate: int
    tau: int
    role: str

    @property
    def why(self) -> str:
        """The role in words (``"earliest divergence"``)."""
        return ROLE_TEXT.get(self.role, self.role)


ROLE_TEXT = {"earliest": "earliest divergence", "median": "median divergence",
             "never": "never diverged", "chosen": "as asked"}


def _example(row: pd.Series, role: str) -> Example:
    return Example(str(row["model"]), str(row["doc_id"]), str(row["action"]),
                   int(row["replicate"]), int(row["tau"]), role)


def choose_examples(replicates: pd.DataFrame, roles: tuple[str, ...] = SHOW_ROLES
                    ) -> list[Example]:
    """The replicates the rule picks (module docstring), per (model, action) in the order the
    actions first appear; a replicate picked by two roles is listed once, under the first.
    An action with no pick among ``roles`` gets its "never" replicate."""
    out: list[Example] = []
    for _, group in replicates.groupby(["model", "action"], sort=False):
        ordered = group.sort_values(["doc_id", "replicate"], kind="stable")
        diverged = ordered[ordered["tau"] >= 1].sort_values(
            ["tau", "doc_id", "replicate"], kind="stable")
        picks: dict[str, pd.Series] = {}
        if len(diverged):
            picks["earliest"] = diverged.iloc[0]
            picks["median"] = diverged.iloc[(len(diverged) - 1) // 2]
        never = ordered[ordered["tau"] == 0]
        if len(never):
            picks["never"] = never.iloc[0]
        if not any(role in picks for role in roles if role != "never") and "never" in picks:
            roles = (*roles, "never") if "never" not in roles else roles
        seen = set()
        for role in roles:
            row = picks.get(role)
            if row is None:
                continue
            key = (row["doc_id"], int(row["replicate"]))
            if key not in seen:
                seen.add(key)
                out.append(_example(row, role))
    return out


def named_examples(replicates: pd.DataFrame, doc: str | None, action: str | None,
                   replicate: int | None) -> list[Example]:
    """Every replicate matching the given document, action and replicate index (those not
    given match all); where no replicate index is given, the rule picks among the matches."""
    rows = replicates
    for column, what, value in (("doc_id", "document", doc), ("action", "action", action)):
        if value is not None:
            checks.choice(value, what, sorted(set(rows[column])), "the run's records")
            rows = rows[rows[column] == value]
    if replicate is None:
        return choose_examples(rows)
    if replicate not in set(rows["replicate"]):
        top = int(replicates["replicate"].max())
        raise ValueError(f"replicate must be an index 0..{top} of the run; got {replicate}")
    rows = rows[rows["replicate"] == replicate].sort_values(["model", "action", "doc_id"])
    return [_example(r, "chosen") for _, r in rows.iterrows()]
