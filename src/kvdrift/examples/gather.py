"""A study directory's examples in one call: the replicates chosen (by the examples rule or by
name), each as an :class:`~kvdrift.examples.views.ExampleView` with the end of its prompt, and
the notes (one line each) on what could not be decoded or rebuilt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvdrift import checks
from kvdrift.examples.decoding import token_text
from kvdrift.examples.prompts import Prompts
from kvdrift.examples.selection import SHOW_ROLES, Example, choose_examples
from kvdrift.examples.trajectories import directory_trajectories, replicates_summary
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
    replicates = replicates_summary(directory)
    if examples is None:
        if action is not None:
            checks.choice(action, "action", sorted(set(replicates["action"])),
                          "the directory's records")
            replicates = replicates[replicates["action"] == action]
        examples = choose_examples(replicates, roles)
    frame = directory_trajectories(directory, [(e.model, e.doc_id, e.action) for e in examples])
    notes = list(frame.attrs.get("notes", ()))
    prompts = Prompts(directory.documents)
    if prompt_tokens and examples and prompts.note is not None:
        notes.append(prompts.note)
    rows = replicates.set_index(["model", "doc_id", "action", "replicate"])
    views = []
    for e in examples:
        tail = None
        if prompt_tokens and token_text(e.model).tokenizer is not None:
            tail, note = prompts.tail(e.model, e.doc_id, token_text(e.model), prompt_tokens)
            if note is not None and note not in notes:
                notes.append(note)
        views.append(example_view(frame, e, tail,
                                  rows.loc[(e.model, e.doc_id, e.action, e.replicate)]))
    return Examples(tuple(views), tuple(notes))
