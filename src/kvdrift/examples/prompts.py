"""The prompt a replicate continues: the end of its document's prompt, as the model saw it.

Records hold no prompt text; the run's recorded study (its document sources) is read again
(a JSONL file from where it was, generated tasks regenerated with the model's tokenizer,
which makes the same documents), encoded as the run encoded it (chat template or not), and
its last tokens decoded. Where the documents cannot be read again, ``note`` says why in one
line and no prompt is shown; so does a prompt whose text is not the one the unit was run on
(its fingerprint's ``prompt_sha256``: the JSONL file changed since).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvdrift.examples.decoding import TokenText


@dataclass(frozen=True)
class Prompts:
    """One model's documents as its run encoded them: ``ids[doc_id]`` the prompt's token ids;
    ``note`` one line where they could not be rebuilt (then ``ids`` is empty)."""

    ids: Mapping[str, tuple[int, ...]]
    note: str | None = None
    sha256: Mapping[str, str] = field(default_factory=dict)  # of each prompt's text

    def tail(self, doc_id: str, texts: TokenText, tokens: int) -> str | None:
        """The last ``tokens`` tokens of the prompt decoded together, or None."""
        ids = self.ids.get(doc_id)
        return None if ids is None else texts.text(ids[-tokens:])


def run_prompts(config: Mapping[str, Any], texts: TokenText) -> Prompts:
    """The prompts of the documents a run's recorded ``config`` names, encoded with the
    model's tokenizer (``texts``) as the run encoded them."""
    from kvdrift.lm.model import encode_prompt
    from kvdrift.run.fingerprint import prompt_sha256
    from kvdrift.study import fixed_documents, model_documents
    from kvdrift.study_config import recorded_study

    if texts.tokenizer is None:
        return Prompts({}, "the prompts are not shown: their tokenizer is not available")
    try:
        study = recorded_study(dict(config))
        if study is None:
            return Prompts({}, "the prompts are not shown: this run recorded no document "
                               "sources")
        docs = model_documents(study, fixed_documents(study), texts.tokenizer)
        ids = {d.id: tuple(int(i) for i in encode_prompt(texts.tokenizer, d.prompt,
                                                         study.chat_template)[0])
               for d in docs}
    except (OSError, ValueError, KeyError) as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()),
                      type(exc).__name__)
        return Prompts({}, f"the prompts are not shown: the run's documents cannot be read "
                           f"again ({reason})")
    return Prompts(ids, sha256={d.id: prompt_sha256(d.prompt) for d in docs})

