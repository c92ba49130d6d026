"""``kvdrift show``'s view of one replicate on a terminal: the end of the prompt, then P's and
Q's tokens aligned position by position, the divergence marked, mismatches highlighted, each
position's TV as a number and a small bar. A long generation is folded around the start, the
divergence, each decoding-time compression (``✂``) and the end
(:mod:`kvdrift.examples.folding`), each folded stretch one dim line saying what it holds.

Every piece of model and user text goes through :func:`kvdrift.text.printable` (control and
bidi characters written as escapes) and into rich ``Text`` as plain text, never as console
markup. Styles are only styles: a console that is not a terminal prints none of them.
"""

from __future__ import annotations

import math

from rich.cells import cell_len
from rich.text import Text

from kvdrift.examples.folding import Folded, joined_text
from kvdrift.examples.views import ExampleView
from kvdrift.text import printable

#: The mark of the position where the branches part (tau; SWRB: J).
DIVERGENCE_MARK = "τ▶"
#: The mark of a position first computed from Q's cache after a decoding-time compression.
COMPRESSION_MARK = "✂"
_EIGHTHS = " ▏▎▍▌▋▊▉█"
BAR_WIDTH = 8


def token_cell(piece: str) -> str:
    """A token's text as shown: quoted, so leading and trailing spaces are seen, escaped."""
    return f"'{printable(piece)}'"


def tv_bar(tv: float, width: int = BAR_WIDTH) -> str:
    """``tv`` in [0, 1] as a bar of ``width`` cells in eighths; ``—`` where not measured."""
    if not math.isfinite(tv):
        return "—".ljust(width)
    eighths = round(min(max(tv, 0.0), 1.0) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[rest] if rest else "")).ljust(width)


def _pad(text: str, width: int) -> str:
    return text + " " * max(width - cell_len(text), 0)


def example_text(view: ExampleView) -> Text:
    """The whole view of one replicate as rich Text (styles for a terminal), one line each:
    a heading, tau, R and R_tv, what Q's cache had lost at tau (where recorded: its share
    of P's attention, then per top position its share, token and context), the prompt's end,
    a header, a row per position shown (``τ▶``/blank, ``✂`` where a compression first shows,
    t, P's token, Q's token, TV bar, TV, ``≠`` where they differ; a long generation folded,
    one line per folded stretch), P's and Q's text (whole; a token repeated more than three
    times in a row written once with its count, ``⟨×N⟩``)."""
    e = view.example
    out = Text()
    out.append(f"{printable(e.model)} · {printable(e.doc_id)} · {printable(e.action)} · "
               f"replicate {e.replicate}", style="bold")
    out.append(f"  ({view.why})\n", style="dim")
    out.append(view.summary() + "\n")
    if view.lost is not None:
        out.append("lost at tau: ", style="bold")
        out.append(view.lost.summary() + ("; most:" if view.lost.tokens else "") + "\n")
        for lost in view.lost.tokens:
            out.append(f"  {100 * lost.share:5.1f}%  position {lost.position:>5}  "
                       f"{token_cell(lost.token)}  ", style="")
            out.append("…" + printable(lost.context) + "…\n", style="dim")
    if view.prompt_tail is not None:
        out.append("prompt ends: ", style="dim")
        out.append("…" + printable(view.prompt_tail) + "\n")
    if view.swrb:
        out.append(f"SWRB records hold the continuation after the scan (t >= J = {view.tau}) "
                   "and no TV per position\n", style="dim")
    if not view.positions:
        out.append("(no tokens recorded)\n", style="dim")
        return out
    folded = view.folded()
    if view.compressions:
        out.append(f"{COMPRESSION_MARK}: the first position read from Q's cache after a "
                   f"compression ({len(view.compressions)} within H)\n   (derived from the "
                   "decoding-time press's target and interval)\n", style="dim")
    if folded.summary() is not None:
        out.append(folded.summary() + "\n", style="dim")
    shown = [p for p in folded.items if not isinstance(p, Folded)]
    p_cells = {p.t: token_cell(p.x_text) for p in shown}
    q_cells = {p.t: token_cell(p.y_text) for p in shown}
    wp = max(cell_len("P"), *(cell_len(c) for c in p_cells.values()))
    wq = max(cell_len("Q"), *(cell_len(c) for c in q_cells.values()))
    wt = max(3, len(str(view.positions[-1].t)))
    cut = 1 if view.compressions else 0  # a column for ✂ only where there are compressions
    out.append(f"{'':{2 + cut}} {'t':>{wt}}  {_pad('P', wp)}  {_pad('Q', wq)}  TV\n",
               style="dim")
    for pos in folded.items:
        if isinstance(pos, Folded):
            out.append(f"{'':{2 + cut}} {'':>{wt}}  {pos.summary()}\n", style="dim")
            continue
        p_cell, q_cell = p_cells[pos.t], q_cells[pos.t]
        mark = DIVERGENCE_MARK if view.marked(pos.t) else ""
        out.append(f"{mark:2}", style="bold yellow")
        if cut:
            out.append(COMPRESSION_MARK if view.compressed(pos.t) else " ", style="bold cyan")
        out.append(f" {pos.t:>{wt}}  ")
        style = "bold red" if pos.mismatch else ""
        out.append(_pad(p_cell, wp), style="bold green" if pos.mismatch else "")
        out.append("  ")
        out.append(_pad(q_cell, wq), style=style)
        out.append("  ")
        out.append(tv_bar(pos.tv), style="magenta")
        tv = "—" if not math.isfinite(pos.tv) else f"{pos.tv:.2f}"
        out.append(f" {tv}" + ("  ≠" if pos.mismatch else "") + "\n")
    out.append("P: ", style="bold green")
    out.append(printable(joined_text([p.x_text for p in view.positions])) + "\n")
    out.append("Q: ", style="bold red")
    out.append(printable(joined_text([p.y_text for p in view.positions])) + "\n")
    return out
