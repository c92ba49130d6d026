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
from kvdrift.report.fit import WIDTH, clip, clip_around, wrapped
from kvdrift.text import printable

#: The mark of the position where the branches part (tau; SWRB: J).
DIVERGENCE_MARK = "τ▶"
#: The mark of a position first computed from Q's cache after a decoding-time compression.
COMPRESSION_MARK = "✂"
_EIGHTHS = " ▏▎▍▌▋▊▉█"
BAR_WIDTH = 8


def token_cell(piece: str, width: int | None = None) -> str:
    """A token's text as shown: quoted, so leading and trailing spaces are seen, escaped;
    within ``width`` cells where given (cut inside the quotes, ``'abc…'``)."""
    text = printable(piece)
    return f"'{text if width is None else clip(text, width - 2)}'"


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
    """The whole view of one replicate as rich Text (styles for a terminal), every line within
    :data:`~kvdrift.report.fit.WIDTH` (80) columns: a heading, tau, R and R_tv, what Q's cache
    had lost at tau (where recorded: its share of P's attention, then per top position its
    share, token and context), the prompt's end, a header, a row per position shown
    (``τ▶``/blank, ``✂`` where a compression first shows, t, P's token, Q's token, TV bar, TV,
    ``≠`` where they differ; a long generation folded, one line per folded stretch), P's and
    Q's text (whole; a token repeated more than three times in a row written once with its
    count, ``⟨×N⟩``). Prose and text wrap with their continuation lines indented; a token or
    a lost token's context too wide for its column is cut with ``…``."""
    e = view.example
    out = Text()
    head = wrapped(Text(f"{printable(e.model)} · {printable(e.doc_id)} · "
                        f"{printable(e.action)} · replicate {e.replicate}", style="bold"),
                   WIDTH, 2)
    why = f"  ({view.why})"  # kept whole: on the heading's last line where it fits
    last = head.plain.rsplit("\n", 1)[-1]
    head.append(why if cell_len(last + why) <= WIDTH else "\n" + why, style="dim")
    out.append_text(head)
    out.append("\n")
    _line(out, Text(view.summary()), 2)
    if view.lost is not None:
        lost = Text("lost at tau: ", style="bold")
        lost.append(view.lost.summary() + ("; most:" if view.lost.tokens else ""))
        _line(out, lost, 2)
        for token in view.lost.tokens:
            row = Text(f"  {100 * token.share:5.1f}%  position {token.position:>5}  "
                       f"{token_cell(token.token, CELL_MOST)}  ")
            context = "…" + printable(token.context) + "…"
            start = max(context.find(OPEN), 0)
            end = max(context.find(CLOSE, start) + 1, start)
            row.append(clip_around(context, WIDTH - row.cell_len, start, end), style="dim")
            _line(out, row, 2)
    if view.prompt_tail is not None:
        prompt = Text("prompt ends: ", style="dim")
        prompt.append("…" + printable(view.prompt_tail))
        _line(out, prompt, 2)
    if view.swrb:
        _line(out, Text(f"SWRB records hold the continuation after the scan (t >= J = "
                        f"{view.tau}) and no TV per position", style="dim"), 2)
    if not view.positions:
        out.append("(no tokens recorded)\n", style="dim")
        return out
    folded = view.folded()
    if view.compressions:
        _line(out, Text(f"{COMPRESSION_MARK}: the first position read from Q's cache after a "
                        f"compression ({len(view.compressions):,} within H)", style="dim"), 3)
        out.append("   (derived from the decoding-time press's target and interval)\n",
                   style="dim")
    if folded.summary() is not None:
        _line(out, Text(folded.summary(), style="dim"), 2)
    shown = [p for p in folded.items if not isinstance(p, Folded)]
    wt = max(3, len(str(view.positions[-1].t)))
    cut = 1 if view.compressions else 0  # a column for ✂ only where there are compressions
    lead = 2 + cut + 1 + wt + 2  # marks, t and the gap before P's token
    room = (WIDTH - lead - len("  ") * 2 - BAR_WIDTH - len(" 0.00  ≠")) // 2
    p_cells = {p.t: token_cell(p.x_text, room) for p in shown}
    q_cells = {p.t: token_cell(p.y_text, room) for p in shown}
    wp = max(cell_len("P"), *(cell_len(c) for c in p_cells.values()))
    wq = max(cell_len("Q"), *(cell_len(c) for c in q_cells.values()))
    out.append(f"{'':{2 + cut}} {'t':>{wt}}  {_pad('P', wp)}  {_pad('Q', wq)}  TV\n",
               style="dim")
    for pos in folded.items:
        if isinstance(pos, Folded):
            _line(out, Text(f"{'':{lead}}{pos.summary()}", style="dim"), lead)
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
    for name, style, side in (("P", "bold green", "x_text"), ("Q", "bold red", "y_text")):
        text = Text(f"{name}: ", style=style)
        text.append(printable(joined_text([getattr(p, side) for p in view.positions])))
        _line(out, text, len("P: "))
    return out


#: The widest a lost token's cell is shown (its context takes the rest of the line).
CELL_MOST = 24
#: The marks around a lost token in its context (:data:`kvdrift.run.lost_context.OPEN`).
OPEN, CLOSE = "⟦", "⟧"


def _line(out: Text, line: Text, indent: int) -> None:
    """``line`` appended to ``out`` wrapped within :data:`~kvdrift.report.fit.WIDTH`, then a
    newline."""
    out.append_text(wrapped(line, WIDTH, indent))
    out.append("\n")
