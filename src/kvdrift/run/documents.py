"""A store's documents: what its units ran on, recorded beside their records.

A store holds, per (model, document), one Parquet file ``documents/<file>.parquet`` of one row
(:data:`COLUMNS`): the document (id, prompt text, stratum, answer, metric, meta) and the
prompt's token ids as the model saw them (chat template applied; null where the pair factory
encodes no text, as the finite tables). Its key-value metadata holds the fingerprint of the
units that wrote it (:mod:`kvdrift.run.fingerprint`: the prompt's hash, the weights' and the
tokenizer's digests) and a digest of the row. It is written with the document's first unit,
before that unit's records, and rewritten only when what it records changes (a unit
recomputed with another tokenizer), so every finished unit has its document. Whatever shows
text (``kvdrift show``, :func:`kvdrift.trajectories`, the report's Examples) reads it, never
the study's sources again: a store copied elsewhere, its JSONL gone, shows the same prompts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from kvdrift.data.document import Document
from kvdrift.json_values import parse_json
from kvdrift.output import OutputDir, readable_stem
from kvdrift.records.schema import KEY, Column
from kvdrift.run import fingerprint as fp

FOLDER = "documents"
#: Key-value metadata: the digest of the row a document file holds.
DIGEST_KEY = b"kvdrift.document"

COLUMNS = (
    *KEY[:3],  # model, doc_id, stratum: as the records name them
    Column("prompt", pa.string(), "the prompt's text (before any chat template)"),
    Column("answer", pa.string(), "the expected answer, null for a free-form prompt"),
    Column("metric", pa.string(), "how outputs are scored against the answer, or null"),
    Column("meta", pa.string(), "the document's meta as JSON (answers, task, length, ...)"),
    Column("prompt_ids", pa.list_(pa.int64()), "the prompt's token ids as the model saw them "
           "(chat template applied; with a question: the context's, then the question's)",
           "language models"),
    Column("question", pa.string(), "the question asked after the compressed context, or "
           "null (the whole prompt was compressed)"),
)
SCHEMA = pa.schema([pa.field(c.name, c.dtype) for c in COLUMNS])


def document_name(model: str, doc_id: str) -> str:
    """A file-system-safe, collision-free file name for a (model, document)."""
    digest = hashlib.sha1(f"{model}\0{doc_id}".encode()).hexdigest()[:12]
    return f"{readable_stem(doc_id)}-{digest}.parquet"


def document_table(model: str, doc: Document, prompt_ids: Sequence[int] | None,
                   fingerprint: Mapping[str, Any] | None = None) -> pa.Table:
    """The one-row table of ``doc`` as ``model`` saw it, with ``fingerprint`` and the row's
    digest in its key-value metadata."""
    row = {"model": model, "doc_id": doc.id, "stratum": doc.stratum, "prompt": doc.prompt,
           "answer": doc.answer, "metric": doc.meta.get("metric"),
           "meta": json.dumps(doc.meta, sort_keys=True, ensure_ascii=False, default=str),
           "prompt_ids": None if prompt_ids is None else [int(i) for i in prompt_ids]}
    if doc.question is not None:  # digested only where present: earlier rows keep theirs
        row["question"] = doc.question
    digest = hashlib.sha256(json.dumps(row, sort_keys=True, ensure_ascii=False)
                            .encode("utf-8", "surrogatepass")).hexdigest()
    row.setdefault("question", None)
    meta = {DIGEST_KEY: digest.encode()}
    if fingerprint is not None:
        meta[fp.METADATA_KEY] = fp.encode(fingerprint)
    return pa.Table.from_pylist([row], schema=SCHEMA).replace_schema_metadata(meta)


def is_recorded(handle: BinaryIO | None, table: pa.Table) -> bool:
    """Whether the open file ``handle`` (None: no file yet) holds ``table`` already (the same
    row and fingerprint): a document is written once."""
    if handle is None:
        return False
    try:
        with handle:
            stored = pq.read_schema(handle).metadata or {}
    except (OSError, pa.ArrowException):
        return False
    wanted = table.schema.metadata or {}
    return all(stored.get(k) == wanted.get(k) for k in (DIGEST_KEY, fp.METADATA_KEY))


@dataclass(frozen=True)
class RecordedDocument:
    """A document as a store recorded it: the document, its prompt's token ids as the model
    saw them (None where not recorded) and the fingerprint of the units that wrote it."""

    document: Document
    prompt_ids: tuple[int, ...] | None
    fingerprint: Mapping[str, Any] | None


def read_documents(root: Path) -> dict[tuple[str, str], RecordedDocument] | None:
    """Every recorded document of the store at ``root`` by (model, document id); None for a
    store written before documents were recorded (no ``documents/`` folder). Read through
    the held folder: a link, device or FIFO there is refused, never followed or waited on."""
    with OutputDir(root, create=False) as store:
        folder = store.subdir(FOLDER)
        names = [n for n in folder.names() if n.endswith(".parquet")]
        if not names and not store.exists(FOLDER):
            return None
        out = {}
        for name in names:
            path = root / FOLDER / name
            try:
                with folder.open_read(name) as handle:
                    table = pq.read_table(handle)
            except (OSError, pa.ArrowException) as exc:
                raise ValueError(f"{path} is unreadable ({str(exc).strip().splitlines()[0]}); "
                                 "rerun the run or study command to record it again") from None
            found = fp.decode(table.schema.metadata)
            for row in table.to_pylist():
                meta = parse_json(row["meta"], str(path)) if row["meta"] else {}
                doc = Document(id=row["doc_id"], prompt=row["prompt"], stratum=row["stratum"],
                               answer=row["answer"], meta=meta if isinstance(meta, dict) else {},
                               question=row.get("question"))
                ids = row["prompt_ids"]
                out[(row["model"], row["doc_id"])] = RecordedDocument(
                    doc, None if ids is None else tuple(ids), found)
        return out
