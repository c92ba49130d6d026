"""A study directory's examples in one call: the replicates chosen (by the examples rule or by
name), each as an :class:`~kvdrift.examples.views.ExampleView` with the end of its prompt, and
the notes (one line each) on what could not be decoded or rebuilt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvdrift.examples.decoding import token_text
from kvdrift.examples.prompts import run_prompts
from kvdrift.examples.selection import SHOW_ROLES, Example, choose_examples
from kvdrift.examples.trajectories import tokenizer_notes
from kvdrift.examples.views import ExampleView, example_view

if TYPE_CHECKING:
    from kvdrift.directory import StudyDirectory

#: Prompt tokens shown before the generations, by default.
PROMPT_TOKENS = 24


@dataclass(frozen=True)
class Examples:
    """Views of chosen replicates, and one-line notes on what is not shown."""

    views: tuple[ExampleView, ...]
    notes: tuple[str, ...]


def gather_examples(directory: StudyDirectory, examples: list[Example] | None = None, *,
                    roles: tuple[str, ...] = SHOW_ROLES, action: str | None = None,
                    prompt_tokens: int = PROMPT_TOKENS) -> Examples:
    """The views of ``examples`` (default: the rule's ``roles`` for every action, or for
    ``action`` only), each with its prompt's last ``prompt_tokens`` tokens."""
    replicates = directory.replicates_summary()
    if examples is None:
        if action is not None:
            replicates = replicates[replicates["action"] == action]
        examples = choose_examples(replicates, roles)
    frame = directory.trajectories(units=[(e.model, e.doc_id, e.action) for e in examples])
    notes = tokenizer_notes({e.model for e in examples})
    prompts = {}
    for model in sorted({e.model for e in examples}):
        prompts[model] = run_prompts(directory.config, token_text(model))
        if prompts[model].note is not None and token_text(model).tokenizer is not None:
            notes.append(prompts[model].note)
    rows = replicates.set_index(["model", "doc_id", "action", "replicate"])
    views = tuple(example_view(frame, e, prompts[e.model].tail(
        e.doc_id, token_text(e.model), prompt_tokens) if prompt_tokens else None,
        rows.loc[(e.model, e.doc_id, e.action, e.replicate)]) for e in examples)
    return Examples(views, tuple(notes))
