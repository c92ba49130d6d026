"""The frontier on a language model: each batch of budgets is a study directory (a *stage*)
under the frontier's output directory, run and resumed like any study.

Stage ``NN-lookL`` holds the budgets the search asked for at look ``L``, with ``replicates`` per
document; look ``L`` uses the seed :func:`look_seed` derives from the search's seed and ``L``
by a hash, so every budget of one look shares each document's random stream (common random
numbers), every look draws fresh replicates, which the search's bounds need, and searches with
different seeds share no stream (docs/method.md section 12).
Re-running the same command replays the search's decisions from the stored stages and
computes only what is missing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kvdrift.frontier_search.families import (
    Budget,
    Family,
    memory_column,
    parse_family,
    user_family,
)
from kvdrift.frontier_search.measure import Measure, parse_measure
from kvdrift.frontier_search.result import FrontierResult
from kvdrift.frontier_search.search import Sample, SearchSettings, frontier_search
from kvdrift.output import OutputDir
from kvdrift.run.outdir import FRONTIER_FILE, check_frontier_dir
from kvdrift.study_config import StudyConfig

RunStage = Callable[[StudyConfig, OutputDir], None]  # runs a study into a folder (resumable)
CONFIG_FILE = FRONTIER_FILE


@dataclass(frozen=True)
class FrontierConfig:
    """A frontier search: the study it runs (model, documents, horizon, ...; its actions are
    replaced by each stage's budgets), the families, the measure and the search settings."""

    study: StudyConfig
    families: tuple[Family, ...]
    measure: Measure
    settings: SearchSettings = SearchSettings()

    @classmethod
    def parse(cls, study: StudyConfig, families: Sequence[str], measure: str,
              settings: SearchSettings, cap: float | None = None) -> FrontierConfig:
        """Families by name: built-in ones, or the user's own among ``study.presses.families``
        (their budgets' press objects join the study's presses)."""
        from kvdrift.user_presses import UserPresses

        user, parsed, made = study.presses, [], {}
        for name in families:
            if name in user.families:
                family, presses = user_family(name, user.family_press)
                made |= presses
            else:
                try:
                    family = parse_family(name)
                except ValueError as exc:
                    if user.families or ":" in name or "+" in name:
                        raise
                    raise ValueError(f"{exc}; a family of your own needs its presses file "
                                     f"again (--presses FILE, with FAMILIES)") from None
            parsed.append(family)
        memory_column(parsed)  # one memory axis: the weights family joins no cache family
        if made:
            study = replace(study, presses=user.merged(UserPresses(made, source=user.source)))
        return cls(study, tuple(parsed), parse_measure(measure, cap), settings)

    def as_dict(self) -> dict:
        study = self.study.as_dict()
        for key in ("name", "actions", "replicates"):
            study.pop(key, None)
        return {"study": study, "families": [f.name for f in self.families],
                "measure": str(self.measure), "cap": self.measure.cap,
                "alpha": self.settings.alpha, "replicates": self.settings.replicates,
                "max_replicates": self.settings.max_replicates,
                "window": self.settings.window}


def look_seed(seed: int, look: int) -> int:
    """The seed of look ``look`` of a search with seed ``seed``: a hash of both (56 bits), so
    no two looks of any two searches share a random stream (``seed + look - 1`` made look 2
    of seed s look 1 of seed s + 1). Every bit keys the streams a look draws, on the CPU too
    (:func:`kvdrift.estimate.common.make_generator`; torch alone keeps the low 32)."""
    digest = hashlib.sha256(f"kvdrift frontier look {seed} {look}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


@dataclass
class StudyEvaluator:
    """Runs each batch of budgets as a stage study under ``out`` (held: each stage's folder
    is opened through it, :class:`~kvdrift.output.OutputDir`) and reads the measure back."""

    config: FrontierConfig
    out: OutputDir
    run_stage: RunStage
    stages: int = 0

    def stage_config(self, budgets: Sequence[Budget], look: int, name: str,
                     replicates: int) -> StudyConfig:
        study = self.config.study
        run = replace(study.run, actions=tuple(b.action for b in budgets),
                      replicates=replicates,
                      seed=look_seed(study.run.seed, look))
        return replace(study, name=name, run=run)

    def evaluate(self, budgets: Sequence[Budget], look: int, replicates: int
                 ) -> dict[Budget, Sample]:
        from kvdrift.directory import StudyDirectory

        self.stages += 1
        name = f"{self.stages:02d}-look{look}"
        where = self.out.subdir(f"stages/{name}")
        try:
            self.run_stage(self.stage_config(budgets, look, name, replicates), where)
            records = StudyDirectory(where).records()
        finally:
            where.close()  # reopened through stages/ if read again: few descriptors held
        out = {}
        for b in budgets:
            steps = records.steps[records.steps["action"] == b.action]
            reps = records.replicates[records.replicates["action"] == b.action]
            if reps.empty:
                raise ValueError(f"stage {where} holds no records of {b.action!r}")
            series = self.config.measure.kind.read(steps, reps)
            values = {doc: group.to_numpy(dtype=float)  # in replicate order
                      for doc, group in series.sort_index().groupby(level="doc_id")}
            memory = memory_column(self.config.families)  # which measure: families.py
            kv = float(reps[memory].mean()) if memory in reps else float("nan")
            out[b] = Sample(values, kv, int(reps["evaluations"].sum()))
        return out


def check_measurable(config: FrontierConfig) -> None:
    """Refuse, before any stage runs, a measure the documents cannot give: the task measure on
    documents of which none has an answer (generated tasks carry theirs)."""
    from kvdrift.frontier_search.measure import NEEDS_ANSWERS
    from kvdrift.study import fixed_documents

    if not config.measure.kind.needs_answers or any(
            s.needs_tokenizer for s in config.study.documents):
        return
    if not any(d.answer is not None for d in fixed_documents(config.study)):
        raise ValueError(f"{NEEDS_ANSWERS}; the documents have none")


def check_saved(out: Path | OutputDir, config: FrontierConfig) -> None:
    """Refuse to resume a frontier directory written with other settings (the settings are
    recorded once the first stage has run, :func:`run_frontier`)."""
    from kvdrift import limits

    folder = out if isinstance(out, OutputDir) else OutputDir(out, create=False)
    path = folder.path / CONFIG_FILE
    mine = config.as_dict()
    if folder.exists(CONFIG_FILE):
        try:
            saved = json.loads(folder.read_bytes(CONFIG_FILE, limits.MAX_CONFIG_BYTES)
                               .decode("utf-8")).get("config")
        except (OSError, ValueError, AttributeError, RecursionError):
            raise ValueError(f"{path} is damaged; use a new --out") from None
        if saved != mine:
            keys = sorted(k for k in mine if saved is None or saved.get(k) != mine[k])
            raise ValueError(f"{out} holds a frontier with other settings (differs in: "
                             f"{', '.join(keys)}); use a new --out or the same settings")


def _write_json(folder: OutputDir, name: str, data: dict) -> None:
    """Write ``data`` to ``name`` in the frontier's held folder, never through a link."""
    from kvdrift.json_values import to_json_safe

    folder.write_text(name, json.dumps(to_json_safe(data), indent=2, allow_nan=False))


def run_frontier(config: FrontierConfig, out: str | Path | OutputDir, run_stage: RunStage,
                 documents: int | None = None) -> FrontierResult:
    """Search the frontier into ``out`` (resumable; a path, or the folder the caller holds
    for the whole command); writes ``frontier.json`` (settings and result) and
    ``analysis.json`` (``{"frontier": ...}``), returns the result (``documents``: how many
    documents give values, if known, which sizes the first look). The folder is marked a
    kvdrift frontier (:data:`~kvdrift.output.MARKER`) when its first stage is created."""
    folder = out if isinstance(out, OutputDir) else OutputDir(out)
    check_frontier_dir(folder.path)  # never outside it, nor into another's, nor via a link
    folder.marker = "frontier"
    check_measurable(config)
    check_saved(folder, config)

    def run_and_record(stage: StudyConfig, where: OutputDir) -> None:
        """Run a stage; after the first, record the settings (validate, then write: a search
        refused before its first stage finished leaves no frontier.json behind)."""
        run_stage(stage, where)
        if not folder.exists(CONFIG_FILE):
            _write_json(folder, CONFIG_FILE, {"config": config.as_dict()})

    evaluator = StudyEvaluator(config, folder, run_and_record)
    result = frontier_search(config.families, config.measure, evaluator, config.settings,
                             documents)
    _write_json(folder, CONFIG_FILE, {"config": config.as_dict(), "result": result.to_json()})
    _write_json(folder, "analysis.json", {"frontier": result.to_json()})
    return result
