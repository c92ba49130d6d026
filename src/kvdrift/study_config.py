"""Study configuration files (TOML): what to run, on which documents, and what to conclude.

Everything is validated before any model is loaded, so a typo costs seconds, not a run.
See ``configs/`` for shipped examples. Layout::

    [study]                      models, actions, replicates, horizon, temperature,
                                 estimator, depths, seed, batch, device, dtype, chat_template,
                                 cohort ("development" | "evaluation", for kvdrift predict),
                                 attribution (record what Q's cache had lost at each
                                 divergence; rollouts only), executor, ray_address,
                                 gpus_per_worker, cpus_per_worker, presses (a Python file
                                 of press objects, relative to the TOML; read by
                                 load_study only, :mod:`kvdrift.user_presses`)
    [[documents]]                one table per source: source = "ruler" | "jsonl" | "hf"
    [analysis]                   bootstrap, alpha, endpoints (prespecified), seed
"""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvdrift import checks, limits, preflight
from kvdrift.analysis.options import AnalysisOptions
from kvdrift.data.document import documents_sha256
from kvdrift.data.sources import DocumentSource, source_from_table
from kvdrift.run.executor_config import ExecutorConfig
from kvdrift.run.run_file import DOCUMENTS_HASH
from kvdrift.run.settings import check_run_numbers
from kvdrift.user_presses import RECORDED_KEY, UserPresses

if TYPE_CHECKING:  # the runner loads torch: imported once a study's settings are checked
    from kvdrift.run.runner import RunConfig

STUDY_KEYS = {
    "name": str, "models": list, "actions": list, "replicates": int, "horizon": int,
    "temperature": (int, float), "estimator": str, "depths": list, "seed": int, "batch": int,
    "device": str,
    "dtype": str, "chat_template": bool, "cohort": str, "attribution": bool,
    "executor": str, "ray_address": str, "gpus_per_worker": float, "cpus_per_worker": float,
    "presses": str, "attention": str, "engine": str,
}
ENGINES = ("transformers", "llama.cpp")
COHORTS = ("development", "evaluation")
SOURCE_KEYS = {
    "ruler": {"source": str, "families": list, "needle_types": list, "lengths": list,
              "per_stratum": int, "seed": int, "question_after": bool},
    "jsonl": {"source": str, "path": str},
    "hf": {"source": str, "name": str, "split": str, "prompt_field": str, "id_field": str,
           "stratum_field": str, "stratum": str, "answer_field": str, "limit": int,
           "question_field": str},
    "records": {"source": str, "documents": list},  # documents handed over in Python
}
REQUIRED_SOURCE_KEYS = {"ruler": (), "jsonl": ("path",), "hf": ("name", "split", "prompt_field"),
                        "records": ("documents",)}
ANALYSIS_KEYS = {"bootstrap": int, "alpha": float, "endpoints": list, "seed": int}
#: What the items of each list-valued key must be.
LIST_ITEMS = {"models": str, "actions": str, "depths": int, "families": str,
              "needle_types": str, "lengths": int, "endpoints": str}
TOP_KEYS = ("study", "documents", "analysis")
_KIND_NAMES = {int: "an integer", str: "a string", list: "a list", bool: "true or false",
               float: "a number"}
_ITEM_NAMES = {int: "integers", str: "strings"}


@dataclass(frozen=True)
class StudyConfig:
    """A validated study: the run settings per model, document sources, analysis options."""

    name: str
    models: tuple[str, ...]
    run: RunConfig  # model field is a placeholder; per-model configs come from for_model
    documents: tuple[DocumentSource, ...]  # parsed [[documents]] tables
    analysis: AnalysisOptions
    device: str = "auto"
    dtype: str = "float32"
    chat_template: bool = True
    cohort: str | None = None  # "development" or "evaluation" (kvdrift predict), or unnamed
    source: str | None = field(default=None, compare=False)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)  # not part of as_dict
    presses: UserPresses = field(default_factory=UserPresses, compare=False)  # press objects
    press_names: frozenset[str] = field(default=frozenset(), compare=False)  # recorded only
    attention: str = "auto"  # press objects' prefill: eager where they read weights, or all
    # models handed over as Q by action name (Python: ``{"mine": kvdrift.Model(...)}``)
    generators: Mapping[str, Any] = field(default_factory=dict, compare=False)
    engine: str = "transformers"  # or "llama.cpp" (docs/llama-cpp.md)

    @property
    def press_actions(self) -> tuple[str, ...]:
        """The actions that are press objects (by name; :mod:`kvdrift.user_presses`)."""
        return tuple(a for a in self.run.actions
                     if self.presses.only([a]) or a in self.press_names)

    def for_model(self, model: str) -> RunConfig:
        """The run settings of one model (with the dtype and prompt format its units record,
        and the identity of each press object among its actions)."""
        from kvdrift.run.runner import RunConfig

        extra = {"dtype": self.dtype, "chat_template": self.chat_template,
                 "eager": self.presses.eager(self.run.actions, self.attention)}
        if self.engine != "transformers":  # recorded only then, so earlier stores resume
            from kvdrift.llamacpp.binding import engine_record

            extra["engine"] = engine_record()
        return RunConfig(**(asdict(self.run) | {
            "model": model, "extra": extra,
            "presses": self.presses.identities(self.run.actions),
            "generators": self.generator_identities()}))

    def generator_identities(self) -> dict[str, dict]:
        """Each action's Q model where it is not P's (:mod:`kvdrift.lm.generators.identity`)."""
        from kvdrift.lm.grammar.model_spec import split_model

        if self.engine == "llama.cpp":
            from kvdrift.llamacpp.factory import llama_q_identities

            return llama_q_identities(self.run.actions, self.models[0])
        if not self.generators and not any(split_model(a)[1] is not None
                                           for a in self.run.actions):
            return {}  # nothing to import
        from kvdrift.lm.generators.identity import q_identities

        return q_identities(self.run.actions, self.generators)

    def as_dict(self) -> dict:
        """The configuration that a study directory records and checks on resume.

        The executor is left out: every executor writes the same records, so a study
        started with one resumes with another.
        """
        run = self.run.as_dict()
        run.pop("model")
        run.pop("extra")
        out = {"name": self.name, "models": list(self.models), **run,
               "device": self.device, "dtype": self.dtype, "chat_template": self.chat_template,
               "documents": [d.as_dict() for d in self.documents],
               "analysis": {**asdict(self.analysis), "endpoints": list(self.analysis.endpoints)}}
        if self.cohort is not None:  # only when named, so older study directories still resume
            out["cohort"] = self.cohort
        if self.press_actions:  # names only: a store never holds the code that made a press
            out[RECORDED_KEY] = list(self.press_actions)
        if self.attention != "auto":  # only when asked, so older stores still resume
            out["attention"] = self.attention
        if self.engine != "transformers":
            out["engine"] = self.engine
        eager = self.presses.eager(self.run.actions, self.attention)
        if eager:  # the press objects whose prefill ran with eager attention
            out["eager_prefill"] = eager
        return out

    def eager_note(self) -> str | None:
        """The one line a run says when it switches a press's prefill to eager attention
        (None: none is switched)."""
        eager = self.presses.eager(self.run.actions, self.attention)
        if not eager:
            return None
        why = ('attention = "eager" was asked for' if self.attention == "eager" else
               "its code reads attention weights, which only eager attention computes")
        return (f"prefill with eager attention for {', '.join(eager)} ({why}); the other "
                f"actions keep the model's attention")


def _check_table(table: Any, allowed: dict, where: str) -> dict:
    if not isinstance(table, dict):
        raise ValueError(f"{where} must be a table")
    for key, value in table.items():
        checks.choice(key, "key", allowed, where)
        kinds = allowed[key]
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and kinds in (int, float))
        if kinds is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            want = _KIND_NAMES.get(kinds, "a number")
            raise ValueError(f"{where}.{key} must be {want}; got {value!r}")
        item = LIST_ITEMS.get(key) if kinds is list else None
        if item is not None and not all(
                isinstance(v, item) and not isinstance(v, bool) for v in value):
            raise ValueError(f"{where}.{key} must be a list of {_ITEM_NAMES[item]}; "
                             f"got {value!r}")
    return table


def check_study_name(name: str) -> str:
    """A study name is one directory name (it becomes ``runs/<name>``): any letters, digits,
    spaces and punctuation of any script, but no path (``/``, ``\\``, ``.``, ``..``) and no
    control characters."""
    from kvdrift.text import printable

    if (not isinstance(name, str) or not name.strip() or name in (".", "..")
            or any(c in name for c in "/\\") or printable(name) != name
            or len(name.encode("utf-8", "surrogatepass")) > 255):
        raise ValueError(f"[study].name must be one directory name (any script, spaces and "
                         f"punctuation; no '/', '\\', control characters, '.' or '..'; at most "
                         f"255 bytes); got {name!r}")
    return name


def _check_source(i: int, source: dict) -> DocumentSource:
    """Check one [[documents]] table (its kind, keys and value types), then build its source."""
    where = f"[[documents]] #{i + 1}"
    if isinstance(source, DocumentSource):  # built in code (documents handed over in memory)
        return source
    if not isinstance(source, dict):
        raise ValueError(f"{where} must be a table")
    kind = checks.choice(source.get("source"), "document source", SOURCE_KEYS, where)
    _check_table(source, SOURCE_KEYS[kind], where)
    for key in REQUIRED_SOURCE_KEYS[kind]:
        if key not in source:
            raise ValueError(f"{where} (source = {kind!r}) is missing the key {key!r}")
    return source_from_table(source, where)  # RULER's values, in-memory documents checked


def parse_study(data: dict, source: str | None = None, presses: UserPresses | None = None,
                press_names: frozenset[str] = frozenset(), read_documents: bool = False,
                before_torch: Callable[[dict[str, Any]], None] | None = None,
                given: frozenset[str] = frozenset()) -> StudyConfig:
    """Validate a parsed TOML document and build the study configuration; everything that
    needs no model is checked before torch or kvpress is imported (:mod:`kvdrift.preflight`;
    ``read_documents``: JSONL document files too, for a study about to run; ``before_torch``
    is handed the checked settings as a store records them, for a caller's own check, e.g.
    :func:`kvdrift.preflight.check_resume`).

    ``presses`` are the press objects some actions name (:mod:`kvdrift.user_presses`);
    ``press_names`` are actions a store recorded as press objects, read back without them;
    ``given`` are actions whose Q is a model handed over in Python (not spec strings).
    [study].presses names a file that only :func:`load_study` executes.
    """
    presses = presses or UserPresses()
    for key in data:
        checks.choice(key, "section", TOP_KEYS)
    if "study" not in data:
        raise ValueError("the config needs a [study] section")
    study = _check_table(data["study"], STUDY_KEYS, "[study]")
    if "presses" in study:
        raise ValueError("[study].presses names a Python file that only a study TOML read by "
                         "load_study (kvdrift study) runs; give press objects here instead")
    for key in ("models", "actions"):
        if key not in study or not study[key]:
            raise ValueError(f"[study] is missing the key {key!r} (a non-empty list)")
        twice = next((v for i, v in enumerate(study[key]) if v in study[key][:i]), None)
        if twice is not None:
            raise ValueError(f"[study].{key} lists {twice!r} twice; each must appear once")
    docs = data.get("documents")
    if not docs:
        raise ValueError("the config needs at least one [[documents]] table "
                         "(source = \"ruler\", \"jsonl\" or \"hf\")")
    if isinstance(docs, dict):
        docs = [docs]
    sources = tuple(_check_source(i, s) for i, s in enumerate(docs))
    analysis = _check_table(data.get("analysis", {}), ANALYSIS_KEYS, "[analysis]")
    actions = tuple(str(a) for a in study["actions"])
    depths = check_run_numbers(  # before torch loads (the runner) and kvpress (the actions)
        replicates=study.get("replicates", 8), horizon=study.get("horizon", 32),
        depths=study.get("depths", ()), batch=study.get("batch", 0),
        temperature=study.get("temperature", 1.0), seed=study.get("seed", 0))
    engine = checks.choice(study.get("engine", "transformers"), "[study].engine", ENGINES)
    # every check that needs no model, before torch, transformers or kvpress (preflight.py);
    # names the user's own presses define are parsed once they are loaded
    if engine == "llama.cpp":
        _check_llama_study(study, actions, presses, given)
    else:
        preflight.check_actions(actions, defined=set(presses.presses) | press_names | set(given))
    preflight.check_settings(
        estimator=study.get("estimator", "rollout"), attribution=study.get("attribution", False),
        dtype=study.get("dtype", "float32"), device=study.get("device", "auto"))
    if study.get("attribution", False):
        from kvdrift.lm.grammar.model_spec import split_model

        other = next((a for a in actions if a in given or split_model(a)[1] is not None), None)
        if other is not None:
            raise ValueError(f"attribution compares P's and Q's prompt caches on one model; "
                             f"action {other!r} runs Q on another model (drop attribution "
                             f"or that action)")
    if isinstance(study.get("models"), list) and engine == "transformers":
        preflight.check_models(study["models"])
    options = AnalysisOptions.from_table(analysis)
    from kvdrift.analysis.endpoints import parse_endpoint

    for text in options.endpoints:
        for name in parse_endpoint(text).actions:
            checks.named_action(name, f"endpoint {text!r}", "the study", actions)
    cohort = study.get("cohort")
    if cohort is not None:
        checks.choice(cohort, "[study].cohort", COHORTS)
    name = check_study_name(study.get("name", Path(source).stem if source else "study"))
    executor = ExecutorConfig(
        kind=study.get("executor", "local"), ray_address=study.get("ray_address"),
        gpus_per_worker=study.get("gpus_per_worker"),
        cpus_per_worker=study.get("cpus_per_worker", 1.0))
    read = preflight.check_documents(sources) if read_documents else None
    fixed = None if read is None else preflight.fixed_documents(sources, read)
    if engine == "transformers" and isinstance(study.get("models"), list):
        preflight.check_prompts(study["models"], fixed, study.get("horizon", 32),
                                study.get("chat_template", True))
    if engine == "transformers" and read is not None:  # llama.cpp caches a question as context
        preflight.check_questions(actions, sources, read, presses.presses,
                                  defined=press_names | given)
    if before_torch is not None:  # e.g. a store to resume, held against these settings
        before_torch({
            "name": name, "models": [str(m) for m in study["models"]], "actions": list(actions),
            "replicates": study.get("replicates", 8), "horizon": study.get("horizon", 32),
            "temperature": float(study.get("temperature", 1.0)),
            "estimator": study.get("estimator", "rollout"), "depths": list(depths),
            "seed": study.get("seed", 0), "batch": study.get("batch", 0),
            "attribution": study.get("attribution", False),
            "device": study.get("device", "auto"), "dtype": study.get("dtype", "float32"),
            "chat_template": study.get("chat_template", True),
            "documents": [s.as_dict() for s in sources]}
            | ({DOCUMENTS_HASH: documents_sha256(fixed)} if fixed is not None else {})
            | ({"engine": engine} if engine != "transformers" else {}))
    from kvdrift.run.runner import RunConfig

    run = RunConfig(
        model="", actions=actions,
        replicates=study.get("replicates", 8), horizon=study.get("horizon", 32),
        temperature=float(study.get("temperature", 1.0)),
        estimator=study.get("estimator", "rollout"), depths=tuple(study.get("depths", ())),
        seed=study.get("seed", 0), batch=study.get("batch", 0),
        attribution=study.get("attribution", False),
    )
    from kvdrift.lm.actions.spec import parse_action  # validates names without loading a model

    for a in actions if engine == "transformers" else ():
        if not presses.only([a]) and a not in press_names and a not in given:
            try:
                parse_action(a)
            except ValueError as exc:
                if presses.presses or ":" in a or "+" in a:  # a spec, not a press's name
                    raise
                raise type(exc)(f"{exc}; a press of your own needs its presses file again "
                                f"(--presses FILE, or presses = \"FILE\" in [study])") from None
    return StudyConfig(
        name=name, models=tuple(str(m) for m in study["models"]), run=run, documents=sources,
        analysis=options, device=study.get("device", "auto"), dtype=study.get("dtype", "float32"),
        chat_template=study.get("chat_template", True), cohort=cohort, source=source,
        executor=executor, presses=presses, press_names=frozenset(press_names),
        attention=checks.choice(study.get("attention", "auto"), "[study].attention",
                                ("auto", "eager")),
        engine=engine,
    )


def _check_llama_study(study: dict, actions: tuple[str, ...], presses: UserPresses,
                       given: frozenset[str]) -> None:
    """What the llama.cpp engine cannot run, refused before anything loads: actions that are
    not its cache types, press objects and models handed over (transformers objects), and
    attribution (it reads transformers' prompt caches)."""
    from kvdrift.llamacpp.cache_types import check_llama_actions

    if presses.presses or given:
        raise ValueError("press objects and models given in Python run in the transformers "
                         "engine; the llama.cpp engine runs cache types and GGUF files")
    if study.get("attribution", False):
        raise ValueError("attribution reads transformers' prompt caches; drop it or use the "
                         "transformers engine")
    check_llama_actions(actions)


def recorded_study(recorded: dict[str, Any]) -> StudyConfig | None:
    """The study a directory recorded (:meth:`StudyConfig.as_dict`), parsed back and checked
    again; None for a store of units run without a study (it records no documents)."""
    if "documents" not in recorded:
        return None
    names = recorded.get(RECORDED_KEY, [])
    return parse_study({"study": {k: v for k, v in recorded.items()
                                  if k in STUDY_KEYS and k != "presses"},
                        "documents": list(recorded["documents"]),
                        "analysis": dict(recorded.get("analysis", {}))},
                       press_names=frozenset(n for n in names if isinstance(n, str))
                       if isinstance(names, list) else frozenset())


def load_study(path: str | Path, overrides: dict[str, Any] | None = None,
               presses: UserPresses | None = None,
               before_torch: Callable[[dict[str, Any]], None] | None = None) -> StudyConfig:
    """Read and validate a study TOML file; ``overrides`` replace keys of its [study] table
    (e.g. ``{"replicates": 2, "horizon": 8}``) and are checked like the file's own keys.

    Every relative path the file names resolves against the TOML's folder, not the working
    directory (:func:`_relative_to`): [study].presses (one in ``overrides``: as given), a
    JSONL source's ``path``, and an HF source's ``name`` where it names a folder there (a
    dataset saved to disk; otherwise it is a hub id). The presses file is executed here
    (:func:`~kvdrift.user_presses.load_presses_file`); ``presses`` (``kvdrift study
    --presses``) joins it, an action name given two different presses being refused."""
    if "\0" in str(path):
        raise ValueError(f"study config path {str(path)!r} holds a NUL character; name a TOML "
                         "file")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"study config {path} does not exist")
    if not path.is_file():  # a folder, /dev/zero, a pipe: never read whole
        raise ValueError(f"study config {path} must be a regular file (a TOML file)")
    try:
        data = tomllib.loads(limits.read_bounded(path).decode("utf-8-sig"))  # a BOM: as JSONL
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text (byte {exc.start + 1}); TOML files must be "
                         "UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path} is not readable TOML: arrays or tables nested too deeply "
                         "(beyond Python's recursion limit)") from None
    except ValueError as exc:  # the size limit (names the file), or an integer too long
        if str(path) in str(exc):
            raise
        raise ValueError(f"{path} is not readable TOML: it holds an integer of more than "
                         f"{sys.get_int_max_str_digits()} digits, longer than Python reads"
                         ) from None
    if overrides:
        data["study"] = dict(data.get("study", {})) | dict(overrides)
    study = data.get("study")
    if isinstance(study, dict) and "presses" in study:
        from kvdrift.user_presses import load_presses_file

        file = study.pop("presses")
        if not isinstance(file, str) or not file.strip():
            raise ValueError(f"[study].presses must be a path to a Python file (relative to "
                             f"{path.name}); got {file!r}")
        relative = overrides is None or "presses" not in overrides
        loaded = load_presses_file(path.parent / file if relative else Path(file))
        presses = loaded.merged(presses) if presses else loaded
    return parse_study(_relative_to(data, path.parent), source=str(path), presses=presses,
                       read_documents=True, before_torch=before_torch)


def _relative_to(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``data`` with its [[documents]] tables' relative paths joined to ``folder`` (the
    TOML's): a JSONL source's ``path``, and an HF source's ``name`` where ``folder / name``
    exists (a saved dataset; a hub id stays as written). Values of the wrong type are left
    for the checks that name them."""
    docs = data.get("documents")
    tables = docs if isinstance(docs, list) else [docs] if isinstance(docs, dict) else []
    for table in tables:
        if not isinstance(table, dict):
            continue
        key = {"jsonl": "path", "hf": "name"}.get(table.get("source"))
        value = table.get(key) if key else None
        if not isinstance(value, str) or not value or "\0" in value or \
                Path(value).is_absolute():
            continue
        joined = folder / value
        if key == "path" or joined.exists():
            table[key] = str(joined)
    return data


DEFAULT_DOCUMENTS = {"source": "ruler", "families": ["niah_single", "vt", "cwe"],
                     "lengths": [512], "per_stratum": 2, "seed": 0}
"""What ``kvdrift run`` measures without ``--docs``: six generated 512-token tasks."""


def single_model_study(
    model: str, actions: tuple[str, ...], docs: str | Path | Sequence[Mapping] | None, *,
    replicates: int,
    horizon: int, temperature: float, estimator: str, depths: tuple[int, ...], seed: int,
    batch: int, device: str, dtype: str, chat_template: bool, name: str = "run",
    attribution: bool = False, presses: UserPresses | None = None, attention: str = "auto",
    before_torch: Callable[[dict[str, Any]], None] | None = None,
    given: Mapping[str, Any] | None = None, engine: str = "transformers",
) -> StudyConfig:
    """The one-model study that ``kvdrift run`` builds from its arguments: the same checks
    and the same pipeline as a study from a TOML file (``presses``: press objects some
    actions name; ``given``: models handed over as Q, by action name)."""
    source: Any = DEFAULT_DOCUMENTS
    if isinstance(docs, str | os.PathLike):
        source = {"source": "jsonl", "path": os.fspath(docs)}
    elif docs is not None:  # objects in memory, checked as JSONL lines are
        from kvdrift.data.sources import RecordsSource

        source = RecordsSource.from_records(docs)
    config = parse_study({
        "study": {"name": name, "models": [model], "actions": list(actions),
                  "replicates": replicates, "horizon": horizon, "temperature": temperature,
                  "estimator": estimator, "depths": list(depths), "seed": seed, "batch": batch,
                  "device": device, "dtype": dtype, "chat_template": chat_template,
                  "attribution": attribution}
        | ({"attention": attention} if attention != "auto" else {})
        | ({"engine": engine} if engine != "transformers" else {}),
        "documents": [source if isinstance(source, DocumentSource) else dict(source)]},
        presses=presses, read_documents=True,
        before_torch=before_torch, given=frozenset(given or ()))
    return replace(config, generators=dict(given)) if given else config
