"""Whether each prompt fits the embedded model's context window, counted before torch loads.

A prompt longer than the window is refused before any unit runs
(:func:`kvdrift.lm.factory.check_fits`), but only once the model and its tokenizer have loaded
(torch and transformers: seconds). The embedded model's converted folder holds its tokenizer
(``tokenizer.json``), chat template and config as checked bytes, and the ``tokenizers`` library
(Rust, no torch) counts with the same tokenizer transformers wraps: :func:`check_prompts_fit`
counts every JSONL document's tokens as :func:`kvdrift.lm.loading.model.encode_prompt` and
``encode_split`` do (the template rendered as transformers renders it) and refuses with the
same line. A test holds the counts against transformers' own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from kvdrift.data.document import Document


def window_refusal(doc_id: str, n: int, horizon: int, name: str, window: int) -> str | None:
    """Why a prompt of ``n`` tokens plus ``horizon`` generated positions does not fit model
    ``name``'s context window of ``window`` tokens, or None."""
    if n + horizon <= window:
        return None
    return (f"document {doc_id!r} has {n} prompt tokens; with H = {horizon} generated "
            f"positions that exceeds {name}'s context window of {window} tokens (allowed: "
            f"prompt tokens <= {window - horizon})")


def _render(template: str) -> Callable[[str], str]:
    """The chat template as transformers renders one user turn with the generation prompt
    (a sandboxed environment, blocks trimmed)."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    compiled = env.from_string(template)
    return lambda text: compiled.render(messages=[{"role": "user", "content": text}],
                                        add_generation_prompt=True)


class PromptCounter:
    """Prompt tokens of the documents, as kvdrift encodes them for a model whose tokenizer,
    chat template (or None) and BOS token are given."""

    def __init__(self, tokenizer_json: str, template: str | None, bos: str | None):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.render = _render(template) if template else None
        self.bos = bos or ""

    def _count(self, text: str, special: bool = False) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=special).ids)

    def count(self, doc: Document, chat_template: bool) -> int:
        """``doc``'s prompt tokens (context and question, where it asks one)."""
        render = self.render if chat_template else None
        if doc.question is None:
            return self._count(render(doc.prompt)) if render else self._count(doc.prompt, True)
        if render:
            marker = "#" * (len(doc.prompt) + 10)  # as encode_split: never inside the text
            head, tail = render(doc.prompt + marker).split(marker)
            return self._count(head) + self._count(doc.question + tail)
        return self._count(self.bos + doc.prompt) + self._count(doc.question + "\n")


def embedded_counter() -> tuple[PromptCounter, int] | None:
    """The embedded model's prompt counter and context window, read through its converted
    folder's checked bytes; None where it is not converted yet (it is at first load)."""
    from kvdrift.lm.loading import converted_cache, embedded

    root = embedded.cache_root()
    target = embedded.smollm2_cache_dir()
    if not root.exists() or converted_cache.refuse_link(target, "converted model") is None:
        return None
    with converted_cache.opened(target, embedded.smollm2_gguf_digest(),
                                converted_cache.user_key(root)) as cache:
        files = {name: cache.read(name).decode("utf-8") for name in cache.files
                 if name in ("tokenizer.json", "chat_template.jinja", "config.json",
                             "tokenizer_config.json")}
    settings: dict[str, Any] = json.loads(files.get("tokenizer_config.json", "{}"))
    template = files.get("chat_template.jinja") or settings.get("chat_template")
    window = json.loads(files["config.json"]).get("max_position_embeddings")
    if "tokenizer.json" not in files or not isinstance(window, int):
        return None
    bos = settings.get("bos_token")
    return PromptCounter(files["tokenizer.json"], template,
                         bos if isinstance(bos, str) else None), window


def check_prompts_fit(docs: Iterable[Document], horizon: int, chat_template: bool,
                      name: str) -> None:
    """ValueError (the line :func:`kvdrift.lm.factory.check_fits` gives) for the first of
    ``docs`` whose prompt plus ``horizon`` exceeds the embedded model ``name``'s context
    window; silent where every one fits or the model is not converted yet."""
    found = embedded_counter()
    if found is None:
        return
    counter, window = found
    if horizon >= window:  # no prompt fits: check_fits says so in its own words
        return
    for doc in docs:
        refusal = window_refusal(doc.id, counter.count(doc, chat_template), horizon, name,
                                 window)
        if refusal is not None:
            raise ValueError(refusal)
