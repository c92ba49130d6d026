"""Reading and writing documents: JSON Lines files and Hugging Face datasets.

A JSONL line is an object with ``id`` (string or integer) and ``prompt`` (non-empty string),
optionally ``stratum`` (string), ``answer`` (string or null) and ``meta`` (object); any other
keys are kept in ``meta`` (e.g. ``metric``, the task metric that scores the answer: see
:mod:`kvdrift.data.scoring`; ``answers``, a list of expected answers). Mistakes are
reported with the file, line number and key.

Instead of ``prompt``, a line may give ``context`` and ``question`` (kvpress's pipeline: the
context is compressed, the question asked after it; a missing question is ``""``), or
``context`` and ``questions``, a list of questions over the one context (strings, or objects
with ``question`` and optionally ``answer``, ``answers``, ``metric``): each becomes a document
of its own, ``<id>:q<i>`` (i from 1), whose ``meta`` names the shared context (``context_id``)
and the question's index; the pair factory compresses the context once for all of them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from kvdrift import checks, limits
from kvdrift.data.document import Document, DocumentError, answer_problem
from kvdrift.json_values import JSONError, parse_json
from kvdrift.text import has_visible_text

_KNOWN_KEYS = ("id", "prompt", "stratum", "answer", "meta", "context", "question",
               "questions")
_QUESTION_KEYS = ("question", "answer", "answers", "metric")


def _documents_from_record(record: Any, where: str) -> list[Document]:
    """Validate one decoded JSONL object: one document, or one per question of a line with
    ``questions``; ``where`` (``file:line``) prefixes every error."""
    if not isinstance(record, dict):
        raise DocumentError(f"{where}: expected a JSON object; got {type(record).__name__}")
    if "questions" not in record:
        return [_document_from_record(record, where)]
    questions = record["questions"]
    if "question" in record or "prompt" in record:
        raise DocumentError(f"{where}: key 'questions' goes with 'context' alone; give "
                            f"'question' or 'questions', and 'context' instead of 'prompt'")
    meta = record.get("meta") if isinstance(record.get("meta"), dict) else {}
    for key in ("answer", "answers", "metric"):
        if key in record or key in meta:
            raise DocumentError(f"{where}: with 'questions', give {key!r} inside each "
                                f"question's object, not on the line")
    if not isinstance(questions, list) or not questions:
        raise DocumentError(f"{where}: key 'questions' must be a non-empty list of questions "
                            f"(strings, or objects with 'question'); got {questions!r:.80}")
    if len(questions) > limits.MAX_DOCUMENTS:
        raise DocumentError(limits.too_many_documents(where, len(questions), 0))
    docs = []
    for i, item in enumerate(questions, 1):
        fields = {"question": item} if isinstance(item, str) else item
        if not isinstance(fields, dict) or "question" not in fields or set(fields) - set(
                _QUESTION_KEYS):
            raise DocumentError(f"{where}: question {i} must be a string or an object with "
                                f"'question' and optionally 'answer', 'answers', 'metric'; "
                                f"got {item!r:.80}")
        one = {k: v for k, v in record.items() if k != "questions"} | fields
        doc = _document_from_record(one, f"{where}, question {i}")
        docs.append(Document(id=f"{doc.id}:q{i}", prompt=doc.prompt, stratum=doc.stratum,
                             answer=doc.answer, question=doc.question,
                             meta={**doc.meta, "context_id": doc.id, "question_index": i}))
    return docs


def _text_key(record: dict, where: str) -> tuple[str, str | None]:
    """The prompt (or context) and the question (None: the whole prompt is compressed)."""
    if "prompt" in record and ("context" in record or "question" in record):
        raise DocumentError(f"{where}: give either 'prompt' (the whole prompt is compressed) "
                            f"or 'context' and 'question' (the question is asked after the "
                            f"compressed context), not both")
    key = "prompt" if "prompt" in record or "context" not in record else "context"
    if key not in record:
        raise DocumentError(f"{where}: missing key 'prompt' (or 'context' and 'question')")
    text = record[key]
    if not isinstance(text, str) or not has_visible_text(text):
        raise DocumentError(f"{where}: key {key!r} must be a non-empty string; "
                            f"got {text!r:.80}")
    if key == "prompt":
        return text, None
    question = record.get("question", "")
    if not isinstance(question, str):
        raise DocumentError(f"{where}: key 'question' must be a string (\"\" for none); "
                            f"got {question!r:.80}")
    return text, question


def _document_from_record(record: dict, where: str) -> Document:
    """One document of a decoded JSONL object (no ``questions``)."""
    if "id" not in record:
        raise DocumentError(f"{where}: missing key 'id'")
    doc_id = record["id"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, str | int) or doc_id == "":
        raise DocumentError(f"{where}: key 'id' must be a non-empty string or integer; "
                            f"got {doc_id!r:.80}")
    prompt, question = _text_key(record, where)
    stratum = record.get("stratum", "default")
    if not isinstance(stratum, str) or not stratum:
        raise DocumentError(f"{where}: key 'stratum' must be a non-empty string; "
                            f"got {stratum!r:.80}")
    answer = record.get("answer")
    meta = record.get("meta", {})
    if not isinstance(meta, dict):
        raise DocumentError(f"{where}: key 'meta' must be an object; got {meta!r:.80}")
    extra = {k: v for k, v in record.items() if k not in _KNOWN_KEYS}
    for key in set(extra) & set(meta):
        if extra[key] != meta[key]:
            raise DocumentError(f"{where}: key {key!r} is given twice with different values "
                                f"({extra[key]!r:.40} and meta's {meta[key]!r:.40}); give it once")
    meta = {**extra, **meta}
    problem = answer_problem(answer, meta)
    if problem is not None:
        raise DocumentError(f"{where}: {problem}")
    return Document(id=str(doc_id), prompt=prompt, stratum=stratum, answer=answer, meta=meta,
                    question=question)


def bounded_lines(handle: BinaryIO, path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of a binary file, never holding more than
    :data:`~kvdrift.limits.MAX_LINE_BYTES` of one line (``/dev/zero`` is refused at once)."""
    lineno = 0
    while True:
        raw = handle.readline(limits.MAX_LINE_BYTES + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > limits.MAX_LINE_BYTES:
            raise DocumentError(str(limits.line_too_long(f"{path}:{lineno}")))
        yield lineno, raw


def load_jsonl(path: str | os.PathLike[str]) -> list[Document]:
    """Documents from a JSON Lines file (blank lines skipped); ids must be unique.

    Lines, documents and prompt text are bounded (:mod:`kvdrift.limits`): a file over a limit
    is refused at the line that crosses it, without reading further; only a regular file is
    read (a FIFO or device is refused, never waited on).
    """
    from kvdrift.output import open_regular

    path = Path(path)
    docs: list[Document] = []
    first_line: dict[str, int] = {}
    held = 0  # bytes of prompt text read so far
    try:
        handle = open_regular(path)
    except FileNotFoundError:
        raise DocumentError(f"document file {path} does not exist; name a JSONL file of "
                            "{\"id\", \"prompt\"} objects, one a line") from None
    with handle:
        for lineno, raw in bounded_lines(handle, path):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a BOM is fine
            except UnicodeDecodeError as err:
                raise DocumentError(f"{where}: not UTF-8 text (byte {err.start + 1} of the line); "
                                 "JSONL files must be UTF-8") from None
            if not line.strip():
                continue
            try:
                record = parse_json(line, where)
            except JSONError as err:
                raise DocumentError(str(err)) from None
            try:
                json.dumps(record, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError as err:
                bad = err.object[err.start:err.end]
                raise DocumentError(f"{where}: holds {bad!r}, half of a surrogate pair (not a "
                                    "character); JSONL text must be valid Unicode") from None
            for doc in _documents_from_record(record, where):
                if doc.id in first_line:
                    raise DocumentError(
                        f"{where}: duplicate id {doc.id!r} (first on line {first_line[doc.id]})"
                    )
                first_line[doc.id] = lineno
                docs.append(doc)
            held += len(raw)
            if len(docs) > limits.MAX_DOCUMENTS or held > limits.MAX_DOCUMENT_BYTES:
                raise DocumentError(limits.too_many_documents(where, len(docs), held))
    if not docs:
        raise DocumentError(f"no documents in {path}")
    return docs


def documents_from_records(records: Any, where: str = "docs") -> list[Document]:
    """Documents from objects held in memory, each as one JSONL line gives it (a dict with
    ``id`` and ``prompt``, or ``context`` and ``question`` or ``questions``) or a
    :class:`Document`; the same checks and limits as :func:`load_jsonl`, each error naming
    the item (``docs[2]: ...``)."""
    if isinstance(records, str | bytes | os.PathLike) or not isinstance(records, list | tuple):
        raise DocumentError(f"{where} must be a list of document objects ({{\"id\", "
                            f"\"prompt\"}} or {{\"id\", \"context\", \"questions\"}}) "
                            f"or a JSONL file's path; got {type(records).__name__}")
    if len(records) > limits.MAX_DOCUMENTS:
        raise DocumentError(limits.too_many_documents(where, len(records), 0))
    docs: list[Document] = []
    first: dict[str, int] = {}
    for i, record in enumerate(records):
        item = f"{where}[{i}]"
        if isinstance(record, Document):  # e.g. from kvdrift.data.generate
            record = document_record(record)
        try:
            json.dumps(record, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as err:
            raise DocumentError(f"{item}: must hold JSON values only (str, int, float, bool, "
                                f"None, list, dict with str keys): {err}") from None
        for doc in _documents_from_record(record, item):
            if doc.id in first:
                raise DocumentError(f"{item}: duplicate id {doc.id!r} (first in "
                                    f"{where}[{first[doc.id]}])")
            first[doc.id] = i
            docs.append(doc)
    if not docs:
        raise DocumentError(f"{where} is empty; give at least one document")
    limits.documents(docs, where)
    return docs


def document_record(doc: Document) -> dict[str, Any]:
    """One document as a JSONL line holds it (:func:`documents_from_records` and
    :func:`load_jsonl` read it back equal)."""
    text = {"prompt": doc.prompt} if doc.question is None else {
        "context": doc.prompt, "question": doc.question}
    record: dict[str, Any] = {"id": doc.id, **text, "stratum": doc.stratum}
    if doc.answer is not None:
        record["answer"] = doc.answer
    if doc.meta:
        record["meta"] = doc.meta
    return record


def write_jsonl(docs: Iterable[Document], path: str | os.PathLike[str]) -> Path:
    """Write documents as JSON Lines (``load_jsonl`` reads them back equal); returns the path."""
    from kvdrift import output

    path = Path(path)
    with output.writing(path.parent, path.name) as handle:  # never through a link
        for doc in docs:
            line = json.dumps(document_record(doc), ensure_ascii=False)
            handle.write((line + "\n").encode("utf-8"))
    return path


def _is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory written by ``Dataset(Dict).save_to_disk``."""
    return path.is_dir() and any(
        (path / marker).exists() for marker in ("dataset_dict.json", "state.json")
    )


def load_hf_dataset(
    name: str,
    split: str,
    prompt_field: str,
    id_field: str | None = None,
    stratum_field: str | None = None,
    stratum: str | None = None,
    limit: int | None = None,
    answer_field: str | None = None,
    question_field: str | None = None,
    **load_kwargs: Any,
) -> list[Document]:
    """Documents from a Hugging Face dataset (hub id, builder name, or local path).

    ``name`` and ``load_kwargs`` go to ``datasets.load_dataset`` (e.g. ``"json"`` with
    ``data_files=...`` for local files); a directory written by ``save_to_disk`` is read with
    ``datasets.load_from_disk``. Without ``id_field`` ids are ``"{name}-{split}-{row}"``. The
    stratum comes from ``stratum_field`` per row, else the fixed ``stratum``, else
    ``"default"``. ``limit`` keeps the first rows only. ``question_field`` (kvpress's
    benchmarks: ``context`` and ``question`` columns) makes ``prompt_field`` the context and
    asks that column's question after it (kvpress's protocol; a null question is ``""``).
    """
    import datasets  # lazy: heavy import, needed only here

    if stratum_field is not None and stratum is not None:
        raise ValueError("give stratum_field or stratum, not both")
    if limit is not None:
        checks.integer(limit, "limit", 1, rule="an integer >= 1 or None")
    if _is_saved_dataset(Path(name)):
        table = datasets.load_from_disk(name)
        if isinstance(table, datasets.DatasetDict):
            checks.choice(split, "split", table, where=name)
            table = table[split]
    else:
        table = datasets.load_dataset(name, split=split, **load_kwargs)
    columns = list(table.column_names)
    for label, column in (
        ("prompt_field", prompt_field), ("id_field", id_field),
        ("stratum_field", stratum_field), ("answer_field", answer_field),
        ("question_field", question_field),
    ):
        if column is not None:
            checks.choice(column, f"{label} column", columns, where=name)
    if limit is not None:
        table = table.select(range(min(limit, len(table))))
    if len(table) > limits.MAX_DOCUMENTS:  # before a row is read
        raise ValueError(limits.too_many_documents(f"{name} [{split}]", len(table), 0)
                         + "; pass a limit (limit = N in the [[documents]] table)")
    source = Path(name).name if Path(name).exists() else name
    docs: list[Document] = []
    first_row: dict[str, int] = {}
    for row_index, row in enumerate(table):
        where = f"{name} [{split}] row {row_index}"
        doc_id = str(row[id_field]) if id_field else f"{source}-{split}-{row_index}"
        prompt = row[prompt_field]
        checks.text(prompt, f"{where}: {prompt_field!r}", visible=True)
        meta: dict[str, Any] = {"source": name, "split": split, "row": row_index}
        answer = row[answer_field] if answer_field else None
        if isinstance(answer, list):  # several acceptable answers, as in Document.answer
            meta["answers"] = [str(a) for a in answer]
            answer = ", ".join(meta["answers"])
        elif answer is not None:
            answer = str(answer)
        doc_stratum = str(row[stratum_field]) if stratum_field else (stratum or "default")
        if doc_id in first_row:
            raise ValueError(f"{where}: duplicate id {doc_id!r} (first in row {first_row[doc_id]})")
        first_row[doc_id] = row_index
        docs.append(
            Document(
                id=doc_id,
                prompt=prompt,
                stratum=doc_stratum,
                answer=answer,
                meta=meta,
                question=None if question_field is None else str(row[question_field] or ""),
            )
        )
    if not docs:
        raise ValueError(f"no documents in {name} [{split}]")
    return docs
