"""A study directory's examples in one call: the replicates chosen (by the examples rule or by
name), each as an :class:`~kvdrift.examples.views.ExampleView` with the end of its prompt, and
the notes (one line each) on what could not be decoded or rebuilt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvdrift import checks
from kvdrift.examples.decoding import token_text
from kvdrift.examples.prompts import Prompts, run_prompts
from kvdrift.examples.selection import SHOW_ROLES, Example, choose_examples
from kvdrift.examples.trajectories import (
    directory_trajectories,
    replicates_summary,
    tokenizer_notes,
)
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
    notes = tokenizer_notes({e.model for e in examples})
    prompts: dict[str, Prompts] = {}
    for model in sorted({e.model for e in examples} if prompt_tokens else ()):
        prompts[model] = run_prompts(directory.config, token_text(model))
        if prompts[model].note is not None and token_text(model).tokenizer is not None:
            notes.append(prompts[model].note)
    rows = replicates.set_index(["model", "doc_id", "action", "replicate"])
    views = []
    for e in examples:
        tail = None
        if prompt_tokens and _same_prompt(directory, e, prompts[e.model], notes):
            tail = prompts[e.model].tail(e.doc_id, token_text(e.model), prompt_tokens)
        views.append(example_view(frame, e, tail,
                                  rows.loc[(e.model, e.doc_id, e.action, e.replicate)]))
    return Examples(tuple(views), tuple(notes))


def _same_prompt(directory: StudyDirectory, example: Example, prompts: Prompts,
                 notes: list[str]) -> bool:
    """Whether the rebuilt prompt of ``example``'s document is the text its unit ran on (a
    note says so where it is not)."""
    rebuilt = prompts.sha256.get(example.doc_id)
    if rebuilt is None:
        return False
    stored = (directory.unit_fingerprint(example.model, example.doc_id, example.action)
              or {}).get("prompt_sha256")
    if stored is not None and stored != rebuilt:
        note = (f"the prompt of document {example.doc_id!r} is not shown: its text has changed "
                "since the run")
        if note not in notes:
            notes.append(note)
        return False
    return True
