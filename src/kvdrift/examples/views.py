"""One chosen replicate ready to show: its positions (P's and Q's text, mismatch, TV), its
tau, R and R_tv, and the end of its prompt. ``kvdrift show`` prints it, the report's
"Examples" section renders it; neither decides what is in it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from kvdrift.examples.folding import Fold, fold
from kvdrift.examples.selection import Example


@dataclass(frozen=True)
class Position:
    """One generated position of a replicate."""

    t: int
    x_text: str
    y_text: str
    mismatch: bool
    tv: float  # NaN where not measured (SWRB)


@dataclass(frozen=True)
class LostToken:
    """A prompt token Q's cache had lost at the divergence (:mod:`kvdrift.lm.attribution`):
    its position, the share of P's attention lost on it, its text and its context."""

    position: int
    share: float
    token: str
    context: str


@dataclass(frozen=True)
class Lost:
    """What Q's cache had lost at a replicate's divergence: the total share of P's attention
    on lost entries and the top positions (as recorded with ``--attribution``)."""

    mass: float
    tokens: tuple[LostToken, ...]

    def summary(self) -> str:
        return (f"{100 * self.mass:.1f}% of P's attention at tau (mean over layers and query "
                "heads) fell on prompt entries Q's cache had lost")


#: Lost tokens shown per example.
LOST_SHOWN = 3


def recorded_lost(row: pd.Series | None) -> Lost | None:
    """The lost context of a replicate row with the attribution columns and a divergence,
    else None."""
    if row is None or "lost_mass" not in row or not math.isfinite(float(row["lost_mass"])):
        return None
    tokens = tuple(LostToken(int(p), float(s), str(t), str(c)) for p, s, t, c in zip(
        row["lost_positions"], row["lost_shares"], row["lost_tokens"], row["lost_contexts"],
        strict=True))
    return Lost(float(row["lost_mass"]), tokens[:LOST_SHOWN])


@dataclass(frozen=True)
class ExampleView:
    """A replicate to show. ``positions`` are those the records hold tokens for: every
    position of a rollout, the continuation after the scan (t >= J) of SWRB. ``tau`` is the
    first mismatch (0: none) of a rollout, the scan length J of SWRB."""

    example: Example
    estimator: str
    horizon: int
    risk: float
    risk_tv: float
    positions: tuple[Position, ...]
    prompt_tail: str | None = None
    lost: Lost | None = None  # recorded with --attribution, for a replicate that diverged
    # positions first computed from a cache a decoding-time press compressed (recorded,
    # derived from the press's target and interval; :mod:`kvdrift.records.generation`)
    compressions: tuple[int, ...] = ()

    @property
    def swrb(self) -> bool:
        return self.estimator == "swrb"

    @property
    def tau(self) -> int:
        return self.example.tau

    @property
    def why(self) -> str:
        """Why it is shown, in words (SWRB's rule orders by the scan length J)."""
        if self.swrb and self.example.role in ("earliest", "median"):
            return f"{'shortest' if self.example.role == 'earliest' else 'median'} scan J"
        return self.example.why

    def marked(self, t: int) -> bool:
        """Whether position ``t`` is where the branches part (tau), or SWRB's J."""
        return t == self.tau

    def compressed(self, t: int) -> bool:
        """Whether position ``t`` is the first to read Q's cache after a compression."""
        return t in self._compression_set

    @property
    def _compression_set(self) -> frozenset[int]:
        return frozenset(self.compressions)

    def folded(self) -> Fold:
        """The positions as shown: a long generation folded around the start, tau, each
        compression and the end (:mod:`kvdrift.examples.folding`)."""
        return fold(self.positions, self.tau, self.compressions)

    def summary(self) -> str:
        """``tau = 5, R = 0.41, R_tv = 0.22`` (SWRB: its J and R term only)."""
        if self.swrb:
            return f"J = {self.tau} (scan length), R term = {_number(self.risk)}"
        tau = str(self.tau) if self.tau else f"never (> H = {self.horizon})"
        return f"tau = {tau}, R = {_number(self.risk)}, R_tv = {_number(self.risk_tv)}"


def _number(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{value:.3f}"


def example_view(frame: pd.DataFrame, example: Example, prompt_tail: str | None = None,
                 replicate: pd.Series | None = None) -> ExampleView:
    """The view of ``example`` from a :func:`~kvdrift.examples.trajectories.trajectory_frame`
    (and its replicate row, for what its cache had lost)."""
    rows = frame[(frame["model"] == example.model) & (frame["doc_id"] == example.doc_id)
                 & (frame["action"] == example.action)
                 & (frame["replicate"] == example.replicate)].sort_values("t")
    if rows.empty:
        raise ValueError(f"no records for {example.doc_id} · {example.action} · replicate "
                         f"{example.replicate}")
    first = rows.iloc[0]
    held = rows[(rows["x_token"] >= 0) & (rows["y_token"] >= 0)]
    positions = tuple(Position(int(r.t), str(r.x_text), str(r.y_text), bool(r.mismatch),
                               float(r.delta)) for r in held.itertuples())
    return ExampleView(example, str(first["estimator"]), int(rows["t"].max()),
                       float(first["R"]), float(first["R_tv"]), positions, prompt_tail,
                       recorded_lost(replicate), recorded_compressions(replicate))


def recorded_compressions(row: pd.Series | None) -> tuple[int, ...]:
    """The ``compression_positions`` of a replicate row (empty where not recorded)."""
    if row is None or "compression_positions" not in row:
        return ()
    value = row["compression_positions"]
    if value is None or isinstance(value, float):  # absent in a unit written before it
        return ()
    return tuple(int(t) for t in value)
