"""A unit's fingerprint: the settings that shaped its records, stored with them.

A stored unit is found again by (model, document, action), but its records also depend on the
run's settings: the horizon, the number of replicates, the temperature, the estimator and
its depths, the seed, the replicate batch, the dtype and prompt format, the document's text,
the kvdrift version and what the model is beyond its name (the SHA-256 of the weights actually
loaded and of the tokenizer, :data:`IDENTITY`). Each unit's Parquet files carry these settings
(key-value metadata ``kvdrift.fingerprint``), and a resumed run checks them before any unit
runs, so records made under other settings are never mixed in, whatever happened to
``run.json``. A run's settings make a document's fingerprint in
:meth:`kvdrift.run.runner.RunConfig.fingerprint`; a stored unit's files are held against it in
one call, :func:`check`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from kvdrift.json_values import parse_json
from kvdrift.lm.loading.digest import short

METADATA_KEY = b"kvdrift.fingerprint"

#: How each setting is named in a refusal (in the order they are compared).
LABELS = {
    "model": "model", "dtype": "dtype", "estimator": "estimator", "replicates": "replicates K",
    "horizon": "horizon H", "temperature": "temperature", "depths": "depths",
    "seed": "seed", "batch": "batch", "chat_template": "chat_template",
    "prompt_sha256": "the document's prompt text", "kvdrift": "kvdrift version",
    "attribution": "attribution", "weights_sha256": "weights", "tokenizer_sha256": "tokenizer",
    "press": "press", "protocol": "protocol", "attention": "prefill attention",
    "q_model": "Q's model", "engine": "engine",
}
#: Settings a fingerprint records only when not at this value (so earlier stores resume).
UNRECORDED = {"attribution": False, "protocol": "whole prompt", "attention": None,
              "engine": None}
#: The model's identity (digests of what was loaded), and a difference in words: compared only
#: where both sides record it (stores written before it, and a driver that has not loaded the
#: weights, do not).
IDENTITY = {"weights_sha256": "other weights", "tokenizer_sha256": "another tokenizer"}


def kvdrift_version() -> str:
    try:
        return metadata.version("kvdrift")
    except metadata.PackageNotFoundError:
        return "unknown"


def prompt_sha256(prompt: str, question: str | None = None) -> str:
    """The hash a fingerprint records of a document's prompt text (and of its question, where
    it has one: the same text split otherwise is another document)."""
    text = prompt if question is None else f"{prompt}\0question\0{question}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def encode(fingerprint: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(fingerprint), sort_keys=True).encode()


def decode(schema_metadata: Mapping[bytes, bytes] | None) -> dict[str, Any] | None:
    """The fingerprint in a Parquet file's key-value metadata, or ``None`` if it has none."""
    raw = (schema_metadata or {}).get(METADATA_KEY)
    if raw is None:
        return None
    try:
        value = parse_json(raw, "fingerprint")
    except ValueError:  # damaged: read as no fingerprint, so the unit is recomputed or refused
        return None
    return value if isinstance(value, dict) else None


def first_difference(stored: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> str | None:
    """How ``stored`` differs from ``wanted`` (one phrase naming the first setting), or None."""
    if stored is None:
        return "it was stored without the settings that made it (an older kvdrift)"
    for key in list(LABELS) + sorted(set(wanted) - set(LABELS)):
        was, now = (stored.get(key, UNRECORDED.get(key)), wanted.get(key, UNRECORDED.get(key)))
        if was != now:
            label = LABELS.get(key, key)
            if key == "prompt_sha256":
                return "the document's prompt text has changed since it was stored"
            if key in IDENTITY:
                if was is None or now is None:
                    continue
                return (f"it was computed with {IDENTITY[key]} under the same model name "
                        f"({label} {short(str(was))}, this run has {short(str(now))})")
            if key == "press":
                from kvdrift.lm.actions.identity import identity_changes

                return (f"its press has changed since it was stored "
                        f"({identity_changes(was, now)})")
            if key == "q_model" and isinstance(was, dict) and isinstance(now, dict):
                changed = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
                shown = ", ".join(f"{k} {short(str(was.get(k)))} -> {short(str(now.get(k)))}"
                                  for k in changed)
                return f"its Q model has changed since it was stored ({shown})"
            return f"it was computed with {label} = {was!r}, this run has {label} = {now!r}"
    return None


def incomplete(stored: Mapping[str, Any] | None, rows: Mapping[str, int]) -> str | None:
    """Which records are missing rows for the replicates K and horizon H that ``stored`` names
    (``rows``: the row counts of a unit's ``steps`` and ``replicates`` files), or None."""
    if stored is None:
        return None
    K, H = stored.get("replicates"), stored.get("horizon")
    if not (isinstance(K, int) and isinstance(H, int)):
        return None
    if rows.get("replicates") != K:
        return f"replicate records are incomplete ({rows.get('replicates')} of {K} rows)"
    if rows.get("steps") != K * H:
        return f"step records are incomplete ({rows.get('steps')} of {K * H} rows)"
    return None


@dataclass(frozen=True)
class Check:
    """A stored unit held against this run's fingerprint: whether its records are complete
    for the settings they were stored with, and whether those settings are this run's."""

    incomplete: str | None  # rows missing (the unit is damaged), or None
    difference: str | None  # the first setting that differs (:func:`first_difference`), or None


def check(schema_metadata: Mapping[bytes, bytes] | None, rows: Mapping[str, int],
          wanted: Mapping[str, Any]) -> Check:
    """Read the fingerprint in a unit's Parquet metadata and hold the unit against ``wanted``:
    its ``rows`` (per record kind) against the K and H it names, its settings against
    ``wanted``'s."""
    stored = decode(schema_metadata)
    return Check(incomplete(stored, rows), first_difference(stored, wanted))
