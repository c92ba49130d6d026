"""Every check of a study's settings that needs no model, in one place, made before torch,
transformers or kvpress is imported (they take seconds to load; a typo should cost a fraction
of one).

:func:`kvdrift.study_config.parse_study` calls these before it builds anything that imports
torch, so ``kvdrift run``, ``kvdrift study`` and the Python API refuse a bad action value,
estimator, dtype, device or document file in one line, in a fresh interpreter, with none of the
three loaded. Each check states its rule once, in the room that owns it (the action grammar,
the run's settings, the model's loading settings); this module only gathers them, so a new
model-free check is one line here.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from kvdrift.data.document import CONTEXT_THEN_QUESTION, Document
from kvdrift.data.sources import DocumentSource, HFSource, JsonlSource, RecordsSource
from kvdrift.lm.grammar.after_context import WHOLE_PROMPT_HINT, spec_refusal
from kvdrift.lm.grammar.names import check_action_names
from kvdrift.lm.grammar.values import check_action_values
from kvdrift.lm.loading.embedded import DEFAULT_MODEL, check_cache
from kvdrift.lm.loading.settings import check_device_name, check_dtype_name
from kvdrift.run.lock import StoreLock
from kvdrift.run.run_file import (
    DOCUMENTS_HASH,
    RUN_FILE,
    config_identity,
    other_configuration,
    read_run_file,
)
from kvdrift.run.settings import check_estimator_name


def check_actions(actions: Iterable[Any], defined: Collection[str] = ()) -> None:
    """Each action's names and values (``defined``: names the user's own presses give)."""
    for action in actions:
        check_action_names(action, defined=defined)
        check_action_values(action, defined=frozenset(defined))


def check_settings(*, estimator: Any, attribution: bool, dtype: Any, device: Any) -> None:
    """The estimator (and whether attribution can follow it), the dtype and the device."""
    check_estimator_name(estimator, attribution)
    check_dtype_name(dtype)
    check_device_name(device)


def check_models(models: Iterable[Any]) -> None:
    """The embedded model's converted cache, where a study uses it: a cache root others can
    write, a link, or a converted folder its sealed manifest does not vouch for is refused
    before torch is imported (:func:`kvdrift.lm.loading.embedded.check_cache`)."""
    from kvdrift.lm.grammar.model_spec import split_p_model

    if any(split_p_model(str(m))[0] == DEFAULT_MODEL for m in models):
        check_cache()


def check_prompts(models: Iterable[Any], docs: list[Document] | None, horizon: int,
                  chat_template: bool) -> None:
    """Each JSONL document's prompt against the embedded model's context window, where a
    study measures it: counted with its tokenizer without torch
    (:func:`kvdrift.lm.loading.prompt_fit.check_prompts_fit`)."""
    if docs and any(str(m) == DEFAULT_MODEL for m in models):
        from kvdrift.lm.loading.prompt_fit import check_prompts_fit

        check_prompts_fit(docs, horizon, chat_template, DEFAULT_MODEL)


def check_documents(sources: Iterable[DocumentSource]) -> list[Document]:
    """The documents known before any model loads: every JSONL file read once (so a missing,
    unreadable or malformed one is refused now) and those handed over in memory; a dataset
    from the hub, and generated documents, wait for their loader."""
    read: list[Document] = []
    for source in sources:
        if isinstance(source, (JsonlSource, RecordsSource)):
            read += source.documents()
    return read


def fixed_documents(sources: Iterable[DocumentSource], read: list[Document]
                    ) -> list[Document] | None:
    """The documents every source gives without a tokenizer (``read``: those of the JSONL
    files and in memory), what a store hashes (:data:`~kvdrift.run.run_file.DOCUMENTS_HASH`),
    or None where one of the sources is a dataset."""
    if any(isinstance(s, HFSource) for s in sources):
        return None
    return read


def _asking(sources: Iterable[DocumentSource], read: Iterable[Document]
            ) -> tuple[str, str] | None:
    """The first document known now to ask a question after its context, as a message names
    it, and how to give whole prompts instead: one read from a file, or a source whose every
    document does (None: none known)."""
    doc = next((d for d in read if d.question is not None), None)
    if doc is not None:
        return f"document {doc.id!r}", WHOLE_PROMPT_HINT
    for source in sources:
        if isinstance(source, HFSource) and source.question_field is not None:
            return (f"every document of dataset {source.name!r}", f"drop question_field = "
                    f"{source.question_field!r}")
        if source.protocol == CONTEXT_THEN_QUESTION:
            return f"every {source.kind} document", "set question_after = false"
    return None


def check_questions(actions: Iterable[str], sources: Iterable[DocumentSource],
                    read: Iterable[Document], presses: Mapping[str, Any],
                    defined: Collection[str] = (), what: str = "action") -> None:
    """Refuse a decoding-time or quantizing action where a document asks a question after its
    context (:mod:`kvdrift.lm.grammar.after_context`), in one line naming both, before
    anything loads or is written: spec strings by their names, the press objects ``presses``
    (by action name) by their class; ``read``: the documents read from files, ``defined``:
    other names that are not specs (models handed over); ``what``: what the names are, for
    the message (a frontier's families)."""
    asking = _asking(sources, read)
    if asking is None:
        return
    document, hint = asking
    for name in actions:
        if name in presses:  # a press object: kvpress is imported already
            from kvdrift.lm.engine.question import press_refusal

            refusal = press_refusal(name, presses[name], document, hint)
        else:
            refusal = spec_refusal(name, set(presses) | set(defined), document, hint, what)
        if refusal is not None:
            raise ValueError(refusal)


#: The recorded settings a resume is held against before torch loads (the store holds the
#: rest, documents included, against the whole configuration once it opens).
RESUMED = ("models", "actions", "replicates", "horizon", "temperature", "estimator", "depths",
           "seed", "batch", "attribution", "device", "dtype", "chat_template")


def check_resume(out: str | os.PathLike[str], settings: Mapping[str, Any]) -> None:
    """Refuse, before torch loads, a store in ``out`` that another process writes now, or
    whose ``run.json`` recorded other ``settings`` (:data:`RESUMED`; ``attribution`` is
    recorded only when on; ``documents``, and their content hash where ``settings`` has it, as
    the store compares them: :func:`~kvdrift.run.run_file.config_identity`): the refusals a
    run otherwise gave after loading its model."""
    root = Path(out)
    if not root.is_dir():
        return
    StoreLock(root).refuse_if_busy()
    if not (root / RUN_FILE).is_file():
        return
    try:
        saved = read_run_file(root / RUN_FILE)["config"]
    except (OSError, ValueError):  # a damaged run.json: the store names it when it opens
        return
    recorded = {"attribution": False} | saved
    diff = [k for k in RESUMED if k in recorded and recorded[k] != settings.get(k)]
    if "documents" in settings and _other_documents(saved, settings):
        diff.append("documents")
    if diff:
        raise other_configuration(root, diff)


def _other_documents(saved: Mapping[str, Any], settings: Mapping[str, Any]) -> bool:
    """Whether ``settings`` name other documents than the store recorded (a JSONL file's
    path counts only where the store recorded no content hash; the hash is compared where
    both have it)."""
    by_content = DOCUMENTS_HASH in saved
    if by_content and DOCUMENTS_HASH not in settings:  # a dataset: the store compares it
        return False
    keys = ("documents", DOCUMENTS_HASH)
    ours = config_identity({k: settings[k] for k in keys if k in settings}, by_content)
    theirs = config_identity({k: saved[k] for k in keys if k in saved}, by_content)
    return ours != theirs
