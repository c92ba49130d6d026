"""The report's "Examples": per action, a few replicates' two generations side by side, so the
numbers above can be read against the text they measure.

Which replicates (:mod:`kvdrift.examples.selection`): per (model, action), the one that
diverged earliest, the one at the lower median of tau among those that diverged, and the
first that never diverged, if any. Text is decoded with the run's own tokenizer (token ids
where it is not available, and a note says so) and written escaped, with control and bidi
characters shown as visible escapes (:func:`kvdrift.report.page.visible`).
"""

from __future__ import annotations

from pathlib import Path

from kvdrift.directory import StudyDirectory
from kvdrift.examples.gather import gather_examples
from kvdrift.examples.selection import ROLES
from kvdrift.report.page import render_blocks, visible
from kvdrift.report.page_model import Block, Generations, Markup, Section

TITLE, ANCHOR = "Examples", "examples"
NOTE = ('<p class="note">Per action, the replicate that diverged earliest (smallest '
        "&tau;), the one at the lower median of &tau; among those that diverged (ties: "
        "document, then replicate) and the first that never diverged, if any. P continues "
        "the prompt with the full cache, Q with the action's. &tau; marks where they part; "
        "an underlined token differs from the other branch's; each token's background is the "
        "position's TV(P, Q), from white (0) to red (1); hover for its value. SWRB records "
        "hold only the continuation after the scan (t &ge; J). Control and direction "
        "characters in the text are shown as escapes (\\x1b, \\u202e).</p>")


def examples_blocks(directory: StudyDirectory, roles: tuple[str, ...] = ROLES,
                    action: str | None = None) -> tuple[Block, ...]:
    """The notes and, per (model, action), a heading and its examples' blocks."""
    found = gather_examples(directory, roles=roles, action=action)
    blocks: list[Block] = [Markup(f'<p class="note">{visible(n)}</p>') for n in found.notes]
    group = None
    for view in found.views:
        e = view.example
        if (e.model, e.action) != group and action is None:
            group = (e.model, e.action)
            blocks.append(Markup(f"<h3>{visible(e.model)} · {visible(e.action)}</h3>"))
        blocks.append(Generations(view))
    return tuple(blocks)


def examples_section(directory: StudyDirectory) -> Section:
    """The "Examples" section of a run or study directory's report."""
    blocks = examples_blocks(directory)
    return Section(TITLE, ANCHOR, ((Markup(NOTE), *blocks),))


def action_example_html(directory: str | Path | StudyDirectory, action: str) -> str:
    """One example of ``action`` in a run or study directory as HTML for a report page (the
    frontier's, at a family's certified budget): the replicate at the median divergence, or,
    where none diverged, the first replicate; with a note where text cannot be decoded."""
    if not isinstance(directory, StudyDirectory):
        directory = StudyDirectory(directory)
    return render_blocks(examples_blocks(directory, ("median",), action))
