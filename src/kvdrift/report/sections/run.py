"""The report's first section, "What was run": models, actions, documents and settings."""

from __future__ import annotations

import json

from kvdrift.analysis.results import StudyAnalysis
from kvdrift.json_values import to_json_safe
from kvdrift.report.page_model import Bullets, Definitions, Details, Markup, Section, Text

ESTIMATORS = {
    "rollout": "complete coupled rollouts",
    "swrb": "survival-weighted residual branching (SWRB)",
}


PROTOCOLS = {
    "whole prompt": "whole prompt compressed, the question and the chat template's tail "
                    "included (as model.generate inside a press)",
    "context, then question": "context compressed, then the question and the chat template's "
                              "tail appended uncompressed for P and Q (kvpress's pipeline)",
}


def protocol_text(config: dict | None) -> str:
    """The protocol a recorded configuration names (``run.json``'s ``protocol``; a store
    without one compressed every prompt whole)."""
    names = (config or {}).get("protocol") or ["whole prompt"]
    return "; ".join(PROTOCOLS.get(str(n), str(n)) for n in names)


def what_was_run(analysis: StudyAnalysis) -> Section:
    """The study's settings as a definition list, then its notes and its configuration."""
    meta = analysis.meta
    docs = meta.documents
    doc_text = None
    if docs:
        doc_text = (", ".join(f"{k}: {v}" for k, v in docs.items())
                    + f" (total {sum(docs.values())}; strata weigh equally)")
    temperature = meta.temperature
    items = (
        ("Models", Text(", ".join(dict.fromkeys(a.model for a in analysis.actions)) or None)),
        ("Actions", Text(", ".join(dict.fromkeys(a.action for a in analysis.actions)) or None)),
        ("Documents per stratum", Text(doc_text)),
        ("Protocol", Text(protocol_text(meta.config))),
        ("Replicates K", Text(meta.replicates)),
        ("Horizon H", Text(meta.horizon, " generated positions")),
        ("Temperature", Text(temperature, " (greedy)" if temperature == 0 else "")),
        ("Estimator", Text(ESTIMATORS.get(meta.estimator, meta.estimator))),
        ("Bootstrap draws", Text(meta.bootstrap, " (documents resampled within strata, "
                                                 "paired across actions)")),
        ("&alpha;", Text(meta.alpha, " (intervals at level 1 &minus; &alpha; unless stated)")),
        ("Package versions",
         Text(", ".join(f"{k} {v}" for k, v in meta.versions.items()) or None)),
    )
    after = []
    if meta.notes:
        after += [Markup("<p><strong>Notes</strong></p>"),
                  Bullets("notes", tuple(Text(n) for n in meta.notes))]
    if meta.config:
        text = json.dumps(to_json_safe(meta.config), indent=2, sort_keys=True)
        after.append(Details("Study configuration", text))
    return Section("What was run", "run", ((Definitions("meta", items),), tuple(after)))
