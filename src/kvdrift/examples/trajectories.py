"""A run's trajectories as one pandas frame with decoded text, one row per generated position.

Columns: the unit and replicate (``model``, ``doc_id``, ``stratum``, ``action``,
``estimator``, ``replicate``), the position ``t``, P's and Q's tokens (``x_token``,
``y_token``) and their text (``x_text``, ``y_text``: each token decoded on its own with the
run's tokenizer, :mod:`.decoding`), ``mismatch``, the position's TV ``delta`` (NaN for SWRB),
and the replicate's ``tau`` (0: never diverged; SWRB: its scan length J), ``R`` (the
mismatch fraction) and ``R_tv`` (the rollout TV, NaN for SWRB).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from typing import TYPE_CHECKING

import pandas as pd

from kvdrift.examples.decoding import TokenText, token_text, tokenizer_mismatch

if TYPE_CHECKING:
    from kvdrift.directory import StudyDirectory

KEY = ["model", "doc_id", "stratum", "action", "estimator", "replicate"]
STEP_COLUMNS = [*KEY, "t", "x_token", "y_token", "mismatch", "delta"]
REPLICATE_COLUMNS = [*KEY, "horizon", "tau", "risk", "risk_tv"]
COLUMNS = [*KEY, "t", "x_token", "y_token", "x_text", "y_text", "mismatch", "delta", "tau",
           "R", "R_tv"]


def decoded_pieces(tokens: pd.Series, models: pd.Series,
                   texts: Callable[[str], TokenText] = token_text) -> list[str]:
    """Each token's text, decoded with its row's model's tokenizer (each distinct
    (model, id) once)."""
    pieces: dict[tuple[str, int], str] = {}
    out = []
    for model, token in zip(models, tokens, strict=True):
        key = (model, int(token))
        if key not in pieces:
            pieces[key] = texts(model).piece(key[1])
        out.append(pieces[key])
    return out


def trajectory_frame(steps: pd.DataFrame, replicates: pd.DataFrame,
                     texts: Callable[[str], TokenText] = token_text) -> pd.DataFrame:
    """The step records joined with their replicate's ``tau``, ``R`` and ``R_tv``, P's and
    Q's tokens decoded; sorted by unit, replicate and position (columns :data:`COLUMNS`)."""
    reps = replicates[[*KEY, "tau", "risk", "risk_tv"]].rename(
        columns={"tau": "replicate_tau", "risk": "R", "risk_tv": "R_tv"})
    frame = steps[STEP_COLUMNS].merge(reps, on=KEY, how="inner", validate="many_to_one")
    frame = frame.rename(columns={"replicate_tau": "tau"})
    frame["x_text"] = decoded_pieces(frame["x_token"], frame["model"], texts)
    frame["y_text"] = decoded_pieces(frame["y_token"], frame["model"], texts)
    order = ["model", "doc_id", "action", "replicate", "t"]
    return frame[COLUMNS].sort_values(order, kind="stable").reset_index(drop=True)


def tokenizer_notes(models, texts: Callable[[str], TokenText] = token_text,
                    recorded: Mapping[str, Set[str]] | None = None) -> list[str]:
    """One line per model whose tokenizer is not available, or is not the one the run
    recorded (``recorded``: each model's recorded tokenizer digests)."""
    notes = []
    for model in sorted(set(models)):
        note = texts(model).note
        if note is None and recorded:
            note = tokenizer_mismatch(model, recorded.get(model, set()))
        if note is not None:
            notes.append(note)
    return notes


def recorded_tokenizers(directory: StudyDirectory) -> dict[str, set[str]]:
    """Each model's tokenizer digests as the store's documents record them (empty for a
    store written before they were)."""
    out: dict[str, set[str]] = {}
    for (model, _), found in (directory.documents or {}).items():
        digest = (found.fingerprint or {}).get("tokenizer_sha256")
        if isinstance(digest, str):
            out.setdefault(model, set()).add(digest)
    return out


def replicates_summary(directory: StudyDirectory) -> pd.DataFrame:
    """One row per replicate of a directory: its unit, ``horizon``, ``tau``, ``risk``,
    ``risk_tv`` and, where recorded, what Q's cache had lost at the divergence
    (``--attribution``) and the positions a decoding-time compression first shows in."""
    from kvdrift.records.schema import GENERATION_COLUMNS, LOST_COLUMNS

    table = directory.store.read("replicates")
    return table.select([c for c in (*REPLICATE_COLUMNS, *LOST_COLUMNS, GENERATION_COLUMNS[2])
                         if c in table.column_names]).to_pandas()


def directory_trajectories(directory: StudyDirectory,
                           units: list[tuple[str, str, str]] | None = None) -> pd.DataFrame:
    """Every replicate's generations in a run or study directory, position by position, P's
    and Q's tokens decoded with the run's own tokenizer (offline, loaded once; token ids where
    it is not available), with each position's TV and the replicate's tau, R and R_tv.
    ``units``: only these (model, doc_id, action). ``attrs["notes"]``: one line per model whose
    tokenizer is not available or not the one the run recorded."""
    steps = directory.store.read("steps", STEP_COLUMNS).to_pandas()
    replicates = replicates_summary(directory)
    if units is not None:
        key = ["model", "doc_id", "action"]
        wanted = pd.MultiIndex.from_tuples(list(units), names=key)
        steps = steps[pd.MultiIndex.from_frame(steps[key]).isin(wanted)]
        replicates = replicates[pd.MultiIndex.from_frame(replicates[key]).isin(wanted)]
    recorded = recorded_tokenizers(directory)  # a bad documents/ part: before the tokenizer
    frame = trajectory_frame(steps, replicates)
    frame.attrs["notes"] = tuple(tokenizer_notes(set(replicates["model"]), recorded=recorded))
    return frame
