"""``kvdrift show``: the generations of a run side by side, where they part."""

from __future__ import annotations

from pathlib import Path

import typer

from kvdrift.cli.common import console, notice, user_errors

SHORT_HELP = "Show P's and Q's generations side by side, where they part."
HELP = (
    "Show P's (full cache) and Q's (compressed) generations of chosen replicates position by "
    "position: the end of the prompt, each position's tokens, mismatches highlighted, the "
    "divergence time tau marked (τ▶), each position's TV as a number and a bar, and the "
    "replicate's tau, R and R_tv; with --attribution records, what Q's cache had lost at tau. "
    "SWRB records show the continuation after the scan (t >= J). Colours only on a terminal. "
    "By default, for each action: the replicate that diverged earliest (smallest tau) and the "
    "one at the lower median of tau among those that diverged (ties: document, then "
    "replicate); an action where none diverged shows its first replicate.")


@user_errors
def show(
    directory: Path = typer.Argument(..., help="A run or study directory."),
    doc: str | None = typer.Option(None, "--doc", help="Only this document (its id)."),
    action: str | None = typer.Option(None, "--action", help="Only this action."),
    replicate: int | None = typer.Option(
        None, "--replicate", help="This replicate index (of each document and action shown) "
        "instead of the default rule."),
    prompt_tokens: int = typer.Option(24, "--prompt-tokens",
                                      help="Prompt tokens shown before the generations."),
) -> None:
    """Show P's and Q's generations side by side: where they part (see ``HELP``)."""
    from kvdrift import checks
    from kvdrift.run.run_file import check_store_dir

    check_store_dir(directory)  # before pandas, pyarrow or the tokenizer load
    checks.integer(prompt_tokens, "--prompt-tokens", 0)
    if replicate is not None:
        checks.integer(replicate, "--replicate", 0)
    from kvdrift.run.documents import read_documents

    read_documents(directory)  # a bad documents/ part: refused before pandas and the tokenizer
    from kvdrift.directory import StudyDirectory
    from kvdrift.examples.gather import gather_examples
    from kvdrift.examples.selection import named_examples
    from kvdrift.examples.trajectories import replicates_summary
    from kvdrift.report.example_text import example_text

    study = StudyDirectory(directory)
    chosen = named_examples(replicates_summary(study), doc, action, replicate)
    found = gather_examples(study, chosen, prompt_tokens=prompt_tokens)
    for note in found.notes:
        notice(note)
    for i, view in enumerate(found.views):
        if i:
            console.print()
        text = example_text(view)
        text.rstrip()
        console.print(text, markup=False, highlight=False, soft_wrap=True)
