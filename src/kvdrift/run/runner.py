"""Run every (document, action) unit of one model through an estimator into a store.

The runner knows nothing about language models: it takes a factory that builds a
kernel pair for a document and an action, so the same loop runs finite tables in
tests and transformers in production. Each unit's seed depends only on the run's
seed and the document id, so a resumed run reproduces what an uninterrupted one
would have written, and all actions of a document share random numbers (common
random numbers make contrasts between actions less noisy).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from kvdrift import checks
from kvdrift.data.document import Document
from kvdrift.estimate.common import (
    concat_results,
    make_generator,
)
from kvdrift.kernel import KernelPair
from kvdrift.records.generation import GenerationMemory, Schedule, generation_memory
from kvdrift.records.schema import (
    GENERATION,
    KV_MEASURE,
    MEMORY_COLUMNS,
    TIMING_COLUMNS,
    WEIGHTS_COLUMNS,
)
from kvdrift.run import UnitStopped
from kvdrift.run.documents import document_table
from kvdrift.run.estimators import Estimator, parse_estimator
from kvdrift.run.fingerprint import kvdrift_version, prompt_sha256
from kvdrift.run.records import UnitKey
from kvdrift.run.settings import check_estimator_name, check_run_numbers
from kvdrift.run.store import RunStore


@dataclass(frozen=True)
class RunConfig:
    """What a run measures; stored in the run directory and checked on resume."""

    model: str = "smollm2"
    actions: tuple[str, ...] = ("snapkv-half",)
    replicates: int = 8
    horizon: int = 32
    temperature: float = 1.0
    estimator: Estimator | str = "rollout"  # a name is parsed into the Estimator
    depths: tuple[int, ...] = ()
    seed: int = 0
    batch: int = 0  # most replicates per forward batch (0: all K at once); bounds memory
    attribution: bool = False  # record what Q's cache had lost at each divergence (lm only)
    extra: dict = field(default_factory=dict)  # e.g. device, dtype, chat template, doc source
    presses: dict = field(default_factory=dict)  # action name -> identity, for press objects
    # action name -> identity of Q's model, where it is not P's (``<action>@<model>``, or a
    # model handed over: :mod:`kvdrift.lm.generators.identity`)
    generators: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "depths", check_run_numbers(
            replicates=self.replicates, horizon=self.horizon, depths=self.depths,
            batch=self.batch, temperature=self.temperature, seed=self.seed))
        object.__setattr__(self, "actions", checks.distinct_items(
            self.actions, "actions", "one or more distinct names (e.g. snapkv-half)"))
        object.__setattr__(self, "estimator", parse_estimator(self.estimator))
        check_estimator_name(self.estimator.name, self.attribution)

    def fingerprint(self, doc: Document, action: str | None = None,
                    identity: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The settings that shape the records of ``doc``'s units (JSON-ready; stored with
        them, :mod:`kvdrift.run.fingerprint`), with the model's ``identity`` where known
        (:class:`RanOn`); a unit whose ``action`` is a press object also records the press's
        identity (:mod:`kvdrift.lm.actions.identity`)."""
        extra = self.extra or {}
        press = {"press": self.presses[action]} if action in self.presses else {}
        if action in self.generators:
            press["q_model"] = self.generators[action]
        return press | {
            "model": self.model, "dtype": extra.get("dtype"), "estimator": self.estimator.name,
            "replicates": self.replicates, "horizon": self.horizon,
            "temperature": float(self.temperature), "depths": list(self.depths),
            "seed": self.seed, "batch": self.batch,
            "chat_template": extra.get("chat_template"),
            "prompt_sha256": prompt_sha256(doc.prompt, doc.question),
            "kvdrift": kvdrift_version(),
        } | ({"attribution": True} if self.attribution else {}) | (
            {"protocol": doc.protocol} if doc.question is not None else {}) | (
            {"attention": "eager"} if action in extra.get("eager", ()) else {}) | (
            {"engine": extra["engine"]} if "engine" in extra else {}) | dict(identity or {})

    def as_dict(self) -> dict:
        out = asdict(self)
        out["actions"], out["depths"] = list(self.actions), list(self.depths)
        out["estimator"] = self.estimator.name
        del out["presses"]  # each unit holds its press's identity (a changed press: per unit)
        del out["generators"]  # and its Q model's
        if not self.attribution:  # recorded only when on, so earlier stores still resume
            del out["attribution"]
        return out


def unit_seed(seed: int, doc_id: str) -> int:
    """A 63-bit seed for one document, stable across processes and runs."""
    digest = hashlib.sha256(f"{seed}\0{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def with_timing(replicates: pa.Table, setup: float, estimator: float) -> pa.Table:
    """Add the measured cost of a unit, which ``kvdrift plan`` sizes studies with.

    ``setup_seconds``: wall time to build the unit's kernel pair (prefill and eviction),
    repeated on each replicate row; a factory that shares a document's prefill between its
    units counts it on the unit that ran it (the document's first); ``replicate_seconds``:
    the estimator's wall time divided by the number of replicates.
    """
    n = replicates.num_rows
    return (replicates
            .append_column(TIMING_COLUMNS[0], pa.array([setup] * n, pa.float64()))
            .append_column(TIMING_COLUMNS[1], pa.array([estimator / n] * n, pa.float64())))


PairFactory = Callable[[Document, str], KernelPair]


@dataclass(frozen=True)
class RanOn:
    """What a unit ran on, as its pair factory tells it (a language model's does, the finite
    tables' do not): the model's ``identity`` (``weights_sha256``, ``tokenizer_sha256``: the
    digests of what was loaded) and the prompt's token ids as the model saw them."""

    identity: dict[str, str] = field(default_factory=dict)
    prompt_ids: tuple[int, ...] | None = None


def factory_identity(make_pair: PairFactory) -> dict[str, str]:
    """The model identity a factory tells (its ``identity``), else empty."""
    return dict(getattr(make_pair, "identity", None) or {})


def ran_on(make_pair: PairFactory, doc: Document) -> RanOn:
    """What ``doc``'s units run on under ``make_pair``: its identity and, from its
    ``prompt_ids`` (the one encoding the model and the attribution use), the prompt's ids."""
    encode = getattr(make_pair, "prompt_ids", None)
    ids = None if encode is None else tuple(int(i) for i in encode(doc).reshape(-1).tolist())
    return RanOn(factory_identity(make_pair), ids)


def run_estimator(config: RunConfig, pair: KernelPair, seed: int):
    """The configured estimator on one pair, in replicate batches of at most ``config.batch``.

    Batches draw from one random generator in turn, so results depend on the batch size
    (it is part of the stored configuration) but never on anything else.
    """
    gen = make_generator(seed, pair.device)
    key_merges = getattr(pair, "key_merges", None)  # CAMPress: Q row r's merges keyed by seed
    if key_merges is not None:
        key_merges(seed)
    K = config.replicates
    size = config.batch or K
    results = []
    for start in range(0, K, size):
        n = min(size, K - start)
        results.append(config.estimator.estimate(pair, n, config.horizon, config.depths,
                                            config.temperature, gen))
    return concat_results(results)


def unit_key(config: RunConfig, doc: Document, action: str) -> UnitKey:
    """The key under which a document's unit for ``action`` is stored."""
    return UnitKey(model=config.model, doc_id=doc.id, action=action, stratum=doc.stratum)


def unit_records(
    config: RunConfig, doc: Document, action: str, make_pair: PairFactory
) -> tuple[pa.Table, pa.Table]:
    """Step and replicate tables of one unit: what every executor computes and stores.

    The replicate table carries the unit's measured cost (:func:`with_timing`), the only
    columns that differ between two runs of the same configuration and seed, and, for
    rollouts of a document with an expected answer whose factory can decode text, the task
    scores of X and Y (:mod:`kvdrift.run.outcomes`); with ``attribution``, what Q's cache had
    lost at each divergence (:mod:`kvdrift.run.lost_context`).
    """
    key = unit_key(config, doc, action)
    seed = unit_seed(config.seed, doc.id)
    started = time.perf_counter()
    try:
        try:
            pair = make_pair(doc, action)
            built = time.perf_counter()
            result = run_estimator(config, pair, seed)
        except BaseException:
            put_back = getattr(make_pair, "put_back", None)  # the model as before the unit
            if put_back is not None:
                put_back()
            raise
        check_unit = getattr(make_pair, "check_unit", None)  # e.g. a press left the weights
        if check_unit is not None:
            check_unit(doc, action)
    except (MemoryError, RuntimeError) as exc:
        if not out_of_memory(exc):
            raise
        raise OutOfMemory(
            f"unit {key.model} · {key.doc_id} · {key.action} ran out of memory with "
            f"{config.batch or config.replicates} replicates per batch ({out_of_memory(exc)}); "
            "lower batch (--batch, or batch in [study]), the horizon or the prompt length "
            "(finished units are kept)") from None
    except UnitStopped as exc:  # e.g. a press that failed on this document: its one line
        raise type(exc)(f"{exc}; the unit is not stored and the run stops here (finished "
                        "units are kept)") from None
    finished = time.perf_counter()
    refuse_nonfinite(key, result)
    steps, reps = config.estimator.tables(key, result, config.depths, doc, pair, make_pair)
    if config.attribution:
        from kvdrift.run.lost_context import with_lost_context

        reps = with_lost_context(reps, result, pair, make_pair, doc)
    return steps, with_memory(with_timing(reps, built - started, finished - built), pair)


class OutOfMemory(ValueError):
    """A unit that an allocation failed for (one line, with what to lower); the limits of
    :mod:`kvdrift.limits` keep most such units from starting, this names the rest."""


def out_of_memory(exc: BaseException) -> str | None:
    """The allocator's words if ``exc`` is an allocation failure (Python's ``MemoryError``,
    torch's out-of-memory error on a GPU or its CPU allocator's), else None."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or \
            "can't allocate memory" in text or "out of memory" in text.lower():
        return text[:200]
    return None


class NonFiniteUnit(ValueError):
    """A unit whose estimator met a probability that is not finite (one line); nothing of the
    unit is stored, so no number is ever computed from NaN."""


def refuse_nonfinite(key: UnitKey, result: Any) -> None:
    """Stop the unit if its result holds a non-finite TV (:meth:`nonfinite` of the
    estimator's result), naming the action, the quantity and the position."""
    found = result.nonfinite() if hasattr(result, "nonfinite") else None
    if found is None:
        return
    raise NonFiniteUnit(
        f"unit {key.model} · {key.doc_id} · {key.action}: {found.quantity} is {found.value} at "
        f"replicate {found.replicate}, position t = {found.position}: the model's next-token "
        f"probabilities under action {key.action!r} are not finite there (an overflow in the "
        "action's quantization or eviction, or in the model's dtype); the unit is not stored "
        "and the run stops here (finished units are kept)")


def with_memory(replicates: pa.Table, pair: KernelPair) -> pa.Table:
    """Add the size of Q's prompt cache where the pair can tell it (language models):
    ``kv_bytes`` and ``kv_fraction`` of the full cache in the model's dtype, how they were
    obtained (``kv_measure``), Q's cache over the generation (``kv_bytes_generation``,
    ``kv_fraction_generation``, ``compression_positions``: :mod:`kvdrift.records.generation`)
    and ``kept_per_layer`` (prompt entries each layer keeps per KV head: for a head-adaptive
    cache, the mean over its KV heads), on each row."""
    weights = getattr(pair, "weights_memory", None)
    # two models: Q's cache on Q's own model (``kv_fraction`` of Q's full cache)
    pair = getattr(pair, "memory_pair", pair)
    memory = getattr(pair, "kv_memory", None)
    if memory is None:
        return replicates
    n = replicates.num_rows
    for name, value in zip(MEMORY_COLUMNS, memory(), strict=True):
        replicates = replicates.append_column(name, pa.array([float(value)] * n, pa.float64()))
    measure = getattr(pair, "kv_measure", None)
    if measure is not None:
        replicates = replicates.append_column(KV_MEASURE.name, pa.array([measure] * n,
                                                                        KV_MEASURE.dtype))
    if not hasattr(pair, "prompt_cache"):  # an engine whose cache keeps every entry
        return _with_weights(replicates, weights)
    kept = pair.prompt_cache("q").kept_per_layer
    if n:
        generation = pair_generation(pair, int(replicates.column("horizon")[0].as_py()))
        values = (generation.kv_bytes, generation.kv_fraction, list(generation.compressions))
        for column, value in zip(GENERATION, values, strict=True):
            replicates = replicates.append_column(column.name,
                                                  pa.array([value] * n, column.dtype))
    replicates = _with_weights(replicates, weights)
    return replicates.append_column("kept_per_layer", pa.array([kept] * n, pa.list_(pa.int64())))


def _with_weights(replicates: pa.Table, weights: Callable[[], tuple] | None) -> pa.Table:
    """Add Q's weights (``weights_bytes``, ``weights_fraction`` of P's) where the pair tells."""
    if weights is None:
        return replicates
    n = replicates.num_rows
    for name, value in zip(WEIGHTS_COLUMNS, weights(), strict=True):
        replicates = replicates.append_column(name, pa.array([float(value)] * n, pa.float64()))
    return replicates


def pair_generation(pair: Any, horizon: int) -> GenerationMemory:
    """Q's cache over ``horizon`` positions of an LM pair (:mod:`kvdrift.records.generation`):
    its decoding rule's compressions and targets, the prompt entries each layer kept, the
    bytes of one full-precision entry per layer (P's cache). A rule that compresses by a
    threshold (DMS) has no derived schedule: NaN memory and no positions, rather than numbers
    that would be wrong."""
    rule = pair.decoding_rule
    try:
        schedule = None if rule is None else Schedule.of_rule(rule, horizon)
    except (AttributeError, TypeError, ValueError):  # a rule without a count of compressions
        return GenerationMemory(math.nan, math.nan, ())
    entry = [2 * k.shape[1] * k.shape[-1] * k.element_size()
             for k in pair.prompt_cache("p").keys]
    kv_bytes, _ = pair.kv_memory()
    return generation_memory(pair.prompt_cache("q").kept_per_layer, entry, kv_bytes,
                             pair.n_prompt, horizon, schedule)


def prepare_document(make_pair: PairFactory, doc: Document, actions: Sequence[str]) -> None:
    """Tell a factory that can share work between a document's units (an LM factory: one
    prefill for all) which actions of ``doc`` are about to be asked for, in order."""
    prepare = getattr(make_pair, "prepare", None)
    if prepare is not None and actions:
        prepare(doc, list(actions))


def finished_units(
    config: RunConfig, documents: Sequence[Document], store: RunStore,
    identity: Mapping[str, str] | None = None,
) -> set[UnitKey]:
    """The units already finished in ``store`` under ``config``'s settings and the model's
    ``identity`` (what of it is known: other weights or another tokenizer under the same
    name are refused).

    Every stored unit is checked against this run's fingerprint before any unit runs: one
    stored under other settings stops the run here (or, if the store recomputes, is removed),
    and a damaged one is removed so that it is computed again.
    """
    done = set()
    for doc in documents:
        for action in config.actions:
            key = unit_key(config, doc, action)
            if store.unit_done(key, config.fingerprint(doc, action, identity)):
                done.add(key)
    return done


def store_unit(store: RunStore, config: RunConfig, doc: Document, action: str,
               tables: tuple[pa.Table, pa.Table], ran: RanOn = RanOn()) -> UnitKey:
    """Write one computed unit with its fingerprint, and its document as the model saw it
    (:mod:`kvdrift.run.documents`), both naming what it ``ran`` on; returns its key."""
    key = unit_key(config, doc, action)
    shared = config.fingerprint(doc, identity=ran.identity)  # the document's: no press
    store.write_unit(key, *tables, fingerprint=config.fingerprint(doc, action, ran.identity),
                     document=document_table(config.model, doc, ran.prompt_ids, shared))
    return key


def run_units(
    config: RunConfig,
    documents: Sequence[Document],
    make_pair: PairFactory,
    store: RunStore,
    on_unit: Callable[[UnitKey, bool], None] | None = None,
) -> int:
    """Run all units not yet in ``store`` in this process; returns how many were run now.

    ``on_unit(key, skipped)`` is called after each unit (``skipped`` for units found done).
    """
    if not documents:
        raise ValueError("no documents to run")
    done = finished_units(config, documents, store, factory_identity(make_pair))
    ran = 0
    for doc in documents:
        prepare_document(make_pair, doc, [a for a in config.actions
                                          if unit_key(config, doc, a) not in done])
        for action in config.actions:
            key = unit_key(config, doc, action)
            if key in done:
                if on_unit:
                    on_unit(key, True)
                continue
            tables = unit_records(config, doc, action, make_pair)  # computed fully, then written
            store_unit(store, config, doc, action, tables, ran_on(make_pair, doc))
            ran += 1
            if on_unit:
                on_unit(key, False)
    return ran
