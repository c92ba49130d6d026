"""Token ids as text, with the run's own tokenizer, loaded offline and once per model.

A run records the model it ran (``model`` column) and its tokenizer's digest (each unit's
fingerprint, :mod:`kvdrift.run.documents`); the tokenizer is loaded by name without the
weights (:func:`kvdrift.lm.loading.model.load_tokenizer`) and its digest checked against the
recorded one (:func:`tokenizer_mismatch` says so in one line where it differs). Where it cannot be
loaded (a model directory moved, a hub id not in the local cache), :class:`TokenText` says so
in one line (``note``) and writes token ids instead of text.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Set
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenText:
    """How one model's token ids become text.

    ``tokenizer`` is None where the model's tokenizer is not available; then ``note`` says
    why in one line and each token is written as its id, ``[id]``. A negative id (SWRB's
    positions before its continuation) is no token and writes as the empty string.
    """

    model: str
    tokenizer: Any | None
    note: str | None = None

    def piece(self, token_id: int) -> str:
        """One token's text on its own (the tokenizer's ``decode([id])``, special tokens
        kept); an id the tokenizer does not have is written ``[id]``."""
        token_id = int(token_id)
        if token_id < 0:
            return ""
        if not self._known(token_id):
            return f"[{token_id}]"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def text(self, token_ids: Iterable[int]) -> str:
        """A sequence of tokens decoded together (negative ids left out); an id outside the
        tokenizer's vocabulary (a damaged or foreign store: 2**32 overflowed the tokenizer,
        issue 52) is written ``[id]`` between the runs decoded on either side."""
        out: list[str] = []
        run: list[int] = []
        for token_id in (int(i) for i in token_ids):
            if token_id < 0:
                continue
            if self._known(token_id):
                run.append(token_id)
                continue
            if run:
                out.append(self.tokenizer.decode(run, skip_special_tokens=False))
                run = []
            out.append(f"[{token_id}]")
        if run:
            out.append(self.tokenizer.decode(run, skip_special_tokens=False))
        return "".join(out)

    def _known(self, token_id: int) -> bool:
        """Whether the tokenizer has ``token_id`` (its vocabulary and added tokens)."""
        return self.tokenizer is not None and token_id < self._size

    @functools.cached_property
    def _size(self) -> int:
        return len(self.tokenizer)


@functools.cache
def token_text(model: str) -> TokenText:
    """The run's model's :class:`TokenText`, its tokenizer loaded offline, once per process."""
    from kvdrift.lm.loading.model import load_tokenizer

    try:
        return TokenText(model, load_tokenizer(model))
    except (OSError, ValueError, ImportError) as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()),
                      type(exc).__name__)
        return TokenText(model, None, f"the tokenizer of model {model!r} is not available "
                                      f"({reason}); token ids are shown instead")


@functools.cache
def _loaded_digest(model: str) -> str | None:
    from kvdrift.lm.loading.digest import tokenizer_digest

    tokenizer = token_text(model).tokenizer
    return None if tokenizer is None else tokenizer_digest(tokenizer)


def tokenizer_mismatch(model: str, recorded: Set[str]) -> str | None:
    """One line where the tokenizer loaded for ``model`` is not one the run recorded (its
    digests ``recorded``; none recorded: stores before digests, nothing to check), else None."""
    from kvdrift.lm.loading.digest import short

    loaded = _loaded_digest(model)
    if loaded is None or not recorded or loaded in recorded:
        return None
    was = ", ".join(short(d) for d in sorted(recorded))
    return (f"the tokenizer of model {model!r} loaded now (digest {short(loaded)}) is not the one "
            f"the run recorded ({was}); text is decoded with the one loaded now and may differ "
            "from what the model saw")
