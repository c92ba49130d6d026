"""The Python API: what the command line offers, as functions that return typed results.

Each function here is also a top-level name of :mod:`kvdrift` (``kvdrift.analyze(...)``).
Results are frozen dataclasses with ``to_json()`` and ``to_frame()`` (pandas); records come
back as pandas DataFrames. See docs/python.md (the Python API guide).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvdrift import checks, limits

if TYPE_CHECKING:
    import pandas as pd

    from kvdrift.analysis.plan import PlanResult
    from kvdrift.analysis.predict import PredictionResult
    from kvdrift.analysis.results import StudyAnalysis
    from kvdrift.directory import Records
    from kvdrift.finite.check import FiniteStudyResult
    from kvdrift.frontier_search.result import FrontierResult
    from kvdrift.lm.loading.user_model import Model
    from kvdrift.measurement import Measurement
    from kvdrift.run.records import UnitKey
    from kvdrift.study_config import StudyConfig


def shipped_config(name: str) -> Path:
    """The path of a study config shipped with kvdrift.

    Example::

        config = kvdrift.load_study(kvdrift.shipped_config("cpu-demo"), replicates=2)

    :param name: the config's name: ``"cpu-demo"``, ``"cpu-dev"``, ``"cpu-eval"``, ... (a
        name not shipped is refused, naming those that are)
    :returns: the TOML file's path inside the installed package
    """
    from importlib import resources

    names = sorted(p.name.removesuffix(".toml")
                   for p in resources.files("kvdrift.configs").iterdir()
                   if p.name.endswith(".toml"))
    checks.choice(name, "shipped config", names)
    return Path(str(resources.files("kvdrift.configs") / f"{name}.toml"))


def embedded_model_path() -> Path:
    """The folder of the embedded SmolLM2-135M-Instruct in transformers' format, for
    ``from_pretrained`` (converted from the GGUF kvdrift ships on first use, once, into the
    user's cache; no download).

    :returns: the converted model's folder; every file in it is checked against the digest
        sealed when it was converted (a link, a foreign or a changed file is refused).

    Example::

        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = kvdrift.embedded_model_path()
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    """
    from kvdrift.lm.loading.model import smollm2_path

    return smollm2_path()


def load_study(path: str | Path, **study: object) -> StudyConfig:
    """A study configuration from a TOML file, validated before any model is loaded.

    Example::

        config = kvdrift.load_study("study.toml", replicates=2, horizon=8)
        kvdrift.run_study(config, "runs/small")

    :param path: the study's TOML file (docs/studies.md); relative paths inside it resolve
        against its folder
    :param study: keys of its ``[study]`` table to replace (``replicates=2, horizon=8``),
        checked as the file's own are
    :returns: the validated :class:`~kvdrift.study_config.StudyConfig`
    """
    from kvdrift.study_config import load_study as load

    return load(path, study)


Actions = Sequence[str] | Mapping[str, object]
"""Actions as the API takes them: spec strings, or a dict from action name to a spec string
(under its own name) or a kvpress press object (``{"mine": MyPress(compression_ratio=0.5),
"snapkv-half": "snapkv-half"}``)."""


Documents = str | Path | Sequence[Mapping[str, object]] | None
"""Documents as the API takes them: a JSONL file's path, a list of document objects as its
lines give them (``[{"id": "a", "prompt": "..."}]`` or ``[{"id": "a", "context": "...",
"questions": ["...", "..."]}]``, docs/documents.md), or None for the six generated
512-token RULER-style tasks."""


def study_from_arguments(
    model: str = "smollm2",
    actions: Actions = ("snapkv-half", "recent-half"),
    docs: Documents = None,
    *,
    replicates: int = 8,
    horizon: int = 32,
    temperature: float = 1.0,
    estimator: str = "rollout",
    depths: Sequence[int] = (),
    seed: int = 0,
    batch: int = 0,
    device: str = "auto",
    dtype: str = "float32",
    chat_template: bool = True,
    name: str = "run",
    attribution: bool = False,
    attention: str = "auto",
    engine: str = "transformers",
) -> StudyConfig:
    """The one-model study that ``kvdrift run`` runs, checked, without running it.

    Example::

        config = kvdrift.study_from_arguments("smollm2", ["snapkv-half"], replicates=2)
        kvdrift.run_study(config, "runs/one")

    :param model: the model: ``"smollm2"`` (embedded), a Hugging Face id or a local folder
    :param actions: spec strings, or press objects by name (:data:`Actions`)
    :param docs: the documents (:data:`Documents`): a JSONL file's path, a list of document
        objects in memory, or None for the six generated 512-token RULER-style tasks
    :param replicates: coupled pairs of generations per (document, action), K
    :param horizon: tokens generated per replicate, H
    :param temperature: sampling temperature of both P and Q (0: greedy)
    :param estimator: ``"rollout"`` (complete coupled rollouts) or ``"swrb"``
    :param depths: window lengths L of the sharp interval ``[R_L, R_L + B_L]`` (``--depths``)
    :param seed: the run's seed; each unit's seed derives from it and the document's id
    :param batch: most replicates per forward batch (0: all K at once); bounds memory
    :param device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``
    :param dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``
    :param chat_template: wrap each prompt in the tokenizer's chat template
    :param name: the study's name (a store's folder name by default)
    :param attribution: record what Q's cache had lost at each divergence (``--attribution``)
    :param attention: ``"auto"`` (eager prefill for presses that read attention weights) or
        ``"eager"`` (for every press object)
    :param engine: ``"transformers"``, or ``"llama.cpp"``: llama.cpp's cache types on GGUF
        files inside llama.cpp (``--engine``, docs/llama-cpp.md)
    :returns: the :class:`~kvdrift.study_config.StudyConfig`, every check that needs no model
        done
    """
    from kvdrift.study_config import single_model_study
    from kvdrift.user_presses import from_actions

    actions, given = _given_models(actions)
    names, presses = from_actions(actions)
    return single_model_study(
        model=model, actions=names, docs=docs, replicates=replicates,
        horizon=horizon, temperature=temperature, estimator=estimator, depths=tuple(depths),
        seed=seed, batch=batch, device=device, dtype=dtype, chat_template=chat_template,
        name=name, attribution=attribution, presses=presses, attention=attention, given=given,
        engine=engine)


def _given_models(actions: Actions) -> tuple[Actions, dict[str, object]]:
    """The actions with the models handed over as Q (``{"int4": kvdrift.Model(...)}``) put
    aside: their names stay (as names), the models as kvdrift holds one come back."""
    if not isinstance(actions, Mapping):
        return actions, {}
    from kvdrift.lm.loading.user_model import Model

    if not any(isinstance(v, Model) for v in actions.values()):
        return actions, {}
    given = {name: value.loaded() for name, value in actions.items()
             if isinstance(value, Model)}
    rest = {name: (name if name in given else value) for name, value in actions.items()}
    return rest, given


def _model_settings(model: object, study: dict) -> tuple[str, object]:
    """The name of ``model`` and, for a :class:`Model`, the model as kvdrift holds one (else
    None); a Model's device and dtype become the study's (``study`` is updated)."""
    from kvdrift.lm.loading.model import DTYPES
    from kvdrift.lm.loading.user_model import Model

    if not isinstance(model, Model):
        return checks.text(model, "model", rule="a model name or path, or a kvdrift.Model"), None
    if "device" in study or "dtype" in study:
        raise ValueError("a Model runs where it is, in its own dtype: give no device or dtype "
                         "with it (move or cast the model first)")
    loaded = model.loaded()
    study |= {"device": str(loaded.device),
              "dtype": next(k for k, v in DTYPES.items() if v == loaded.dtype)}
    return model.name, loaded


def measure(
    model: str | Model = "smollm2",
    actions: Actions = ("snapkv-half", "recent-half"),
    docs: Documents = None,
    out: str | Path | None = None,
    *,
    replicates: int = 8,
    horizon: int = 32,
    temperature: float = 1.0,
    estimator: str = "rollout",
    depths: Sequence[int] = (),
    seed: int = 0,
    batch: int = 0,
    device: str | None = None,
    dtype: str | None = None,
    chat_template: bool = True,
    name: str = "run",
    attribution: bool = False,
    attention: str = "auto",
    engine: str = "transformers",
    bootstrap: int | None = None,
    alpha: float | None = None,
    recompute: bool = False,
    on_unit: Callable[[UnitKey, bool], None] | None = None,
) -> Measurement:
    """Measure ``actions`` on a model and return the records and their analysis.

    A model already loaded runs on its own device and in its own dtype, and is given back as
    it was found (training mode, hooks, attention implementation, cache settings;
    :mod:`kvdrift.lm.loading.user_model`), so one object serves many calls. With ``out``
    None nothing is written anywhere: the records stay in memory.

    Example::

        result = kvdrift.measure("smollm2", ["snapkv-half", "recent-half"],
                                 [{"id": "a", "prompt": "Summarise: ..."}],
                                 replicates=4, horizon=16)
        result                     # in a notebook: one row per action
        result.to_frame()          # the numbers, with _lo/_hi columns

    :param model: a name to load (``"smollm2"``, a Hugging Face id or a local folder) or a
        model already loaded, ``kvdrift.Model(hf_model, tokenizer, "name")``
    :param actions: spec strings, or a dict from action name to a spec string or a kvpress
        press object (:data:`Actions`)
    :param docs: the documents (:data:`Documents`): a JSONL file's path, a list of document
        objects in memory (``[{"id": "a", "prompt": "..."}]``, ``[{"id": "a", "context":
        "...", "questions": ["...", "..."]}]``), or None for six generated long-context tasks
    :param out: a folder to store the run in, as ``kvdrift run --out`` (resumable), or None
    :param replicates: coupled pairs of generations per (document, action), K
    :param horizon: tokens generated per replicate, H
    :param temperature: sampling temperature of both P and Q (0: greedy)
    :param estimator: ``"rollout"`` (complete coupled rollouts) or ``"swrb"``
    :param depths: window lengths L of the sharp interval ``[R_L, R_L + B_L]``
    :param seed: the run's seed; each unit's seed derives from it and the document's id
    :param batch: most replicates per forward batch (0: all K at once); bounds memory
    :param device: ``"auto"`` (default), ``"cpu"``, ``"cuda"``, ...; none with a
        :class:`Model` (it runs where it is)
    :param dtype: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"``; none with a
        :class:`Model`
    :param chat_template: wrap each prompt in the tokenizer's chat template
    :param name: the study's name, recorded with the records
    :param attribution: record what Q's cache had lost at each divergence
    :param attention: ``"auto"`` (eager prefill for presses that read attention weights,
        said in one line) or ``"eager"`` (for every press object)
    :param engine: ``"transformers"`` or ``"llama.cpp"`` (docs/llama-cpp.md)
    :param bootstrap: the analysis's bootstrap draws (``0``: point estimates, fast; None: the
        study's 1000)
    :param alpha: the intervals' level is ``1 - alpha`` (None: 0.05)
    :param recompute: with ``out``, recompute units stored under other settings instead of
        refusing them (``--recompute``)
    :param on_unit: called as ``on_unit(key, skipped)`` when each unit finishes (progress)
    :returns: a :class:`~kvdrift.measurement.Measurement`: ``records`` (steps and replicates
        as DataFrames), ``analysis``, and ``out``
    """
    study: dict[str, object] = {
        "replicates": replicates, "horizon": horizon, "temperature": temperature,
        "estimator": estimator, "depths": depths, "seed": seed, "batch": batch,
        "chat_template": chat_template, "name": name, "attribution": attribution,
        "attention": attention, "engine": engine}
    study |= {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
    import contextlib
    from dataclasses import replace

    from kvdrift.analysis.options import check_overrides

    check_overrides(bootstrap, alpha)  # before any work, not after the whole study
    from kvdrift.analysis.study import analyze as analyze_records
    from kvdrift.directory import Records, StudyDirectory
    from kvdrift.lm.generators.build import load_side_model
    from kvdrift.lm.loading.user_model import Model, left_as_found
    from kvdrift.measurement import Measurement
    from kvdrift.run.store import package_versions
    from kvdrift.study import fixed_documents, protocol_record, run_in_memory
    from kvdrift.study import run_study as run

    given = model if isinstance(model, Model) else None
    model_name, loaded = _model_settings(model, study)
    config = study_from_arguments(model_name, actions, docs, **study)  # type: ignore[arg-type]
    keep = contextlib.ExitStack()
    for handed in [given, *(actions.values() if isinstance(actions, Mapping) else ())]:
        if isinstance(handed, Model):  # P, and every Q handed over, given back as found
            keep.enter_context(left_as_found(handed.model))
    with keep:
        if out is not None:
            run(config, out, recompute=recompute, on_unit=on_unit,
                models={model_name: loaded} if given is not None else None)
            directory = StudyDirectory(out)
            return Measurement(directory.records(), directory.analyze(bootstrap, alpha),
                               directory.path)
        if given is None and config.engine == "transformers":
            from kvdrift.lm.loading.pretrained import check_model_name

            check_model_name(model_name)
            loaded = load_side_model(model_name, config.device, config.dtype)
        store = run_in_memory(config, {model_name: loaded}, on_unit=on_unit)
    steps, replicates = store.read("steps").to_pandas(), store.read("replicates").to_pandas()
    options = replace(config.analysis, **{k: v for k, v in (("bootstrap", bootstrap),
                                                            ("alpha", alpha)) if v is not None})
    recorded = config.as_dict() | protocol_record(config, fixed_documents(config))
    versions = package_versions()
    analysis = analyze_records(steps, replicates, options, meta={
        "config": recorded, "versions": versions, "temperature": config.run.temperature})
    return Measurement(Records(steps, replicates, recorded, versions), analysis, None)


def run_study(
    config: StudyConfig | str | Path,
    out: str | Path | None = None,
    *,
    on_unit: Callable[[UnitKey, bool], None] | None = None,
) -> Path:
    """Run every unit of a study into a folder; resumable: finished units are kept.

    Example::

        out = kvdrift.run_study(kvdrift.shipped_config("cpu-demo"), "runs/demo")
        kvdrift.analyze(out).to_frame()

    :param config: a :class:`~kvdrift.study_config.StudyConfig` or a study TOML's path
    :param out: the folder (default ``runs/<name>``)
    :param on_unit: called as ``on_unit(key, skipped)`` when each unit finishes (progress)
    :returns: the folder the records are stored in
    """
    from kvdrift.study import run_study as run

    if not hasattr(config, "models"):
        config = load_study(config)
    out = Path(out) if out is not None else Path("runs") / config.name
    run(config, out, on_unit=on_unit)
    return out


def load_records(directory: str | Path) -> Records:
    """A run or study directory's step and replicate records as pandas DataFrames.

    Example::

        records = kvdrift.load_records("runs/demo")
        records.replicates.groupby("action")["tau"].describe()

    :param directory: a folder written by ``kvdrift run``, ``kvdrift study`` or
        :func:`measure` with ``out``
    :returns: :class:`~kvdrift.directory.Records`: ``steps`` (a row per position),
        ``replicates`` (a row per replicate; columns in :mod:`kvdrift.records.schema`), the
        recorded configuration and package versions
    """
    from kvdrift.directory import StudyDirectory

    return StudyDirectory(directory).records()


def trajectories(directory: str | Path) -> pd.DataFrame:
    """A run or study directory's generations as one pandas frame (what ``kvdrift show``
    prints). A tokenizer that is not available or not the one the run recorded is named in a
    warning (and in ``attrs["notes"]``).

    Example::

        frame = kvdrift.trajectories("runs/demo")
        frame[(frame.action == "snapkv-half") & (frame.replicate == 0)][["t", "x_text", "y_text"]]

    :param directory: a run or study folder
    :returns: a row per (document, action, replicate, position): P's and Q's tokens and their
        text (decoded offline with the run's own tokenizer; token ids where it is not
        available), the position's TV, and the replicate's tau, R and R_tv
        (:mod:`kvdrift.examples.trajectories`)
    """
    import warnings

    from kvdrift.directory import StudyDirectory
    from kvdrift.examples.trajectories import directory_trajectories

    frame = directory_trajectories(StudyDirectory(directory))
    for note in frame.attrs["notes"]:
        warnings.warn(note, stacklevel=2)
    return frame


def analyze(directory: str | Path, bootstrap: int | None = None,
            alpha: float | None = None, wait: bool = False) -> StudyAnalysis:
    """The study analysis of a run or study directory. A partial store says so in
    ``meta.notes`` and ``meta.run["partial"]``.

    Example::

        analysis = kvdrift.analyze("runs/demo", bootstrap=2000)
        analysis.contrasts_frame()[["a", "b", "dR", "dR_lo", "dR_hi"]]

    :param directory: a run or study folder
    :param bootstrap: bootstrap draws (None: the options the store saved)
    :param alpha: the intervals' level is ``1 - alpha`` (None: the saved one)
    :param wait: wait until a run writing the store has finished
    :returns: the :class:`~kvdrift.analysis.results.StudyAnalysis`: a notebook shows its
        table; ``to_frame()``, ``contrasts_frame()`` and the others give DataFrames
    """
    from kvdrift.analysis.options import check_overrides

    check_overrides(bootstrap, alpha)  # before the records are read
    from kvdrift.directory import StudyDirectory

    return StudyDirectory(directory).analyze(bootstrap, alpha, wait)


def finite_state(systems: int = 24, replicates: int = 512, horizon: int = 3,
                 seed: int = 0) -> FiniteStudyResult:
    """The paper's finite-state check: naive rollouts and SWRB against exact risk, on
    random finite systems whose risk is enumerated (seconds; no model).

    Example::

        check = kvdrift.finite_state(systems=8, replicates=128)
        check.to_frame()

    :param systems: random finite systems drawn
    :param replicates: replicates of each estimator per system
    :param horizon: the systems' horizon H (exact enumeration grows as V^H)
    :param seed: the draw's seed
    :returns: the :class:`~kvdrift.finite.check.FiniteStudyResult`: per system, both
        estimators against the exact risk, and their variance ratio
    """
    from kvdrift.finite.check import run_finite_study

    return run_finite_study(systems, replicates, horizon, seed)


def predict(dev: str | Path, evaluation: str | Path, contrast: str, *, window: int = 32,
            margin: float = 0.02, alpha: float = 0.05, bootstrap: int = 10000,
            seed: int = 0, target: str = "tv") -> PredictionResult:
    """Predict a full-horizon contrast from its first positions, calibrated on a
    development study and checked on an evaluation one (``kvdrift predict``).

    Example::

        result = kvdrift.predict("runs/dev", "runs/eval", "R(recent-half) - R(snapkv-half)")
        result.to_frame()

    :param dev: the development study's folder
    :param evaluation: the evaluation study's folder (same actions)
    :param contrast: ``"R(a) - R(b)"``
    :param window: positions 1..window observed
    :param margin: the margin the prediction is held to
    :param alpha: the intervals' level is ``1 - alpha``
    :param bootstrap: bootstrap draws
    :param seed: the bootstrap's seed
    :param target: ``"tv"`` (rollout TV, the paper's) or ``"tokens"`` (token mismatch)
    :returns: the :class:`~kvdrift.analysis.predict.PredictionResult`
    """
    from kvdrift.directory import StudyDirectory

    return StudyDirectory(dev).predict(StudyDirectory(evaluation), contrast, window=window,
                                       margin=margin, alpha=alpha, draws=bootstrap, seed=seed,
                                       target=target)


def plan(dev: str | Path, target: str, halfwidth: float, alpha: float = 0.05,
         endpoints: int = 1) -> PlanResult:
    """Documents per stratum and K for a target half-width, from a development study
    (``kvdrift plan``).

    Example::

        kvdrift.plan("runs/dev", "R(recent-half) - R(snapkv-half)", halfwidth=0.02).to_frame()

    :param dev: the development study's folder
    :param target: the endpoint to size, as a study's endpoints are written
    :param halfwidth: the interval's half-width wanted
    :param alpha: the intervals' level is ``1 - alpha``
    :param endpoints: prespecified endpoints sharing ``alpha`` (Bonferroni)
    :returns: the :class:`~kvdrift.analysis.plan.PlanResult`: documents and K per design,
        and the cheaper estimator
    """
    from kvdrift.directory import StudyDirectory

    return StudyDirectory(dev).plan(target, halfwidth, alpha, endpoints)


def frontier(
    families: Sequence[str] | Mapping[str, object] = ("snapkv", "recent", "kivi"),
    measure: str = "R_tv <= 0.1",
    out: str | Path = "runs/frontier",
    *,
    alpha: float = 0.05,
    replicates: int = 8,
    max_replicates: int = limits.DEFAULT_SEARCH_REPLICATES,
    cap: float | None = None,
    **study: object,
) -> FrontierResult:
    """The least KV cache per family certified within the tolerance of ``measure``, at level
    ``1 - alpha`` over the whole search (``kvdrift frontier``); resumable in ``out``. Settings
    that could certify nothing even if every value were at the best end of the measure's range
    are refused before any model loads.

    Example::

        result = kvdrift.frontier(["snapkv", "recent"], "R_tv <= 0.1", "runs/frontier",
                                  horizon=16)
        result                     # in a notebook: a row per family x budget

    :param families: names (``"snapkv"``, ``"kivi"``, ...) or a dict from family name to a
        function of the ratio kept returning a kvpress press (a family of your own;
        built-in families stand under their own name: ``{"snapkv": "snapkv"}``)
    :param measure: the tolerance, ``"R_tv <= 0.1"`` (``R``, ``F``, ``kl``, ``acceptance``,
        ``task``)
    :param out: the folder the search is stored in (resumable)
    :param alpha: the guarantee's level is ``1 - alpha`` over the whole search
    :param replicates: replicates of a budget's first look
    :param max_replicates: most replicates any budget is given
    :param cap: a bound on an unbounded measure's values (``kl``), without which it gets
        estimates only
    :param study: :func:`study_from_arguments`' keywords (``model``, which may be a
        :class:`Model`, ``docs``, ``horizon``, ``temperature``, ``seed``, ``device``, ...);
        its actions are the budgets searched
    :returns: the :class:`~kvdrift.frontier_search.result.FrontierResult`: per family the
        least budget certified, and every budget's look
    """
    import contextlib
    from dataclasses import replace

    from kvdrift.frontier_search.feasibility import check_feasible
    from kvdrift.frontier_search.search import SearchSettings
    from kvdrift.frontier_search.study import FrontierConfig, run_frontier
    from kvdrift.lm.loading.user_model import Model, left_as_found
    from kvdrift.study import run_study as run
    from kvdrift.user_presses import FROM_PYTHON, checked

    if "actions" in study or "estimator" in study:
        raise ValueError("frontier takes no actions or estimator: it runs each family's "
                         "budgets with complete coupled rollouts")
    own = {}
    if isinstance(families, Mapping):
        own = {name: f for name, f in families.items() if not isinstance(f, str)}
        for name, f in families.items():
            if isinstance(f, str) and f != name:
                raise ValueError(f"families: a built-in family stands under its own name "
                                 f"({{{f!r}: {f!r}}}); got {{{name!r}: {f!r}}}")
    given = study.get("model") if isinstance(study.get("model"), Model) else None
    if given is not None:
        study["model"], loaded = _model_settings(given, study)
    config = study_from_arguments(actions=("full",), name="frontier", **study)
    config = FrontierConfig.parse(
        replace(config, presses=checked(None, own, FROM_PYTHON)), tuple(families), measure,
        SearchSettings(alpha=alpha, replicates=replicates, max_replicates=max_replicates),
        cap)
    documents = _document_count(config.study, config.measure)
    check_feasible(config.measure, documents, alpha, len(config.families), max_replicates)

    @functools.cache
    def load(name: str) -> object:  # every stage runs on the study's device and dtype
        from kvdrift.lm.generators.build import load_side_model

        return load_side_model(name, config.study.device, config.study.dtype)

    def run_stage(stage: StudyConfig, where: Path) -> None:
        models = {given.name: loaded} if given is not None else None
        run(stage, where, load=load, models=models)

    with left_as_found(given.model) if given is not None else contextlib.nullcontext():
        return run_frontier(config, out, run_stage, documents)


def _document_count(config: StudyConfig, measure) -> int:
    """How many documents a study's sources give that can give the measure's values, without
    a model (generated tasks, which carry answers, counted from their settings)."""
    from kvdrift.data.ruler import document_count
    from kvdrift.data.sources import RulerSource
    from kvdrift.frontier_search.feasibility import gives_values

    return sum(document_count(source.config) if isinstance(source, RulerSource)
               else sum(gives_values(d, measure) for d in source.documents())
               for source in config.documents)


def __getattr__(name: str) -> object:
    if name == "Model":  # the class, imported on first use (it imports torch)
        from kvdrift.lm.loading.user_model import Model

        return Model
    raise AttributeError(f"module 'kvdrift.api' has no attribute {name!r}")


__all__ = ["Model", "analyze", "embedded_model_path", "finite_state", "frontier", "load_records",
           "load_study", "measure", "plan", "predict", "run_study", "shipped_config",
           "study_from_arguments", "trajectories"]
