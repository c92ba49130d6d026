"""``kvdrift show`` within 80 columns for a 1,000-position generation (issue 60, item 4): the
heading, the lost context, the prompt's end, each row and P's and Q's text wrap or are cut,
and the folding, tau and the ✂ marks stay. Widths are counted here independently of the code
under test: an East Asian wide or fullwidth character takes two columns, a combining mark
none."""

from __future__ import annotations

import random
import re
import unicodedata

from kvdrift.examples.selection import Example
from kvdrift.examples.views import ExampleView, Lost, LostToken, Position
from kvdrift.report.example_text import COMPRESSION_MARK, DIVERGENCE_MARK, example_text
from kvdrift.report.fit import break_offsets, clip, clip_around
from kvdrift.text import printable


def columns(line: str) -> int:
    """Columns a terminal draws ``line`` in."""
    width = 0
    for char in line:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


H, TAU = 1000, 412
CUTS = tuple(range(66, H + 1, 64))  # interval 64: 15 compressions within H
MODEL = "/home/someone/models/HuggingFaceTB/SmolLM2-135M-Instruct-finetuned-on-licences"
ACTION = "decoding-knorm:interval=64,target=128"
DOC = "licence-commentary-document-with-a-rather-long-identifier"


def piece(t: int, side: str) -> str:
    """Token pieces as a real tokenizer writes them: words with a leading space, a wide
    (CJK) token, a combining accent, a whitespace token wider than a column, a newline and
    an ESC."""
    return {5: "漢字の長いトークンです", 6: " " * 40, 7: "\n", 9: " cafe\u0301",
            10: "\x1b[2J"}.get(t, f" {side}word{t}")


def long_view() -> ExampleView:
    def differs(t: int) -> bool:
        return t >= TAU and (t % 3 == 0 or t == TAU)

    positions = tuple(Position(t, piece(t, "p"), piece(t, "q" if differs(t) else "p"),
                               differs(t), 0.5) for t in range(1, H + 1))
    context = "文字" * 30 + "Permission is hereby ⟦ granted⟧, free of charge, to any " * 3
    lost = Lost(0.42, (LostToken(17, 0.25, " granted" * 6, context),
                       LostToken(200, 0.1, "\t", "short ⟦\t⟧ context")))
    tail = ("Permission is hereby granted, free of charge,\n to any person obtaining a copy "
            "of this software 漢字の長いテキスト and associated documentation files\x1b]0;x\x07")
    return ExampleView(Example(MODEL, DOC, ACTION, 3, TAU, "earliest"), "rollout", H, 0.3, 0.2,
                       positions, tail, lost, CUTS)


def test_show_of_a_folded_1000_position_generation_fits_80_columns():
    text = example_text(long_view()).plain
    lines = text.splitlines()
    wide = [(columns(line), line) for line in lines if columns(line) > 80]
    assert not wide, wide[:3]
    row = re.compile(rf"^({DIVERGENCE_MARK}|  )[{COMPRESSION_MARK} ] +\d+  '")
    rows = [line for line in lines if row.match(line)]
    assert [int(line[4:8]) for line in rows if line[2] == COMPRESSION_MARK] == list(CUTS)
    assert [int(line[4:8]) for line in rows if line.startswith(DIVERGENCE_MARK)] == [TAU]
    assert sum("positions folded (t = " in line for line in lines) >= len(CUTS)
    assert "folded " in text and "of 1,000 positions" in text
    # the heading, wrapped, still names the model, the document and the action whole
    heading = " ".join(line.strip() for line in lines[:lines.index(next(
        line for line in lines if line.startswith("tau = ")))])
    assert f"{MODEL} · {DOC} · {ACTION} · replicate 3" in heading
    # control characters escaped, never raw
    assert "\x1b" not in text and "\\x1b[2J" in text and "\\x07" in text
    # the lost token's context keeps the token and its marks
    assert any("⟦ granted⟧" in line and "position    17" in line for line in lines)


def test_show_wraps_p_and_q_text_whole():
    view = long_view()
    lines = example_text(view).plain.splitlines()
    start, end = (next(i for i, line in enumerate(lines) if line.startswith(f"{n}: "))
                  for n in "PQ")
    assert end - start > 1  # P's text is wrapped, continuation lines indented
    assert all(line.startswith("   ") for line in lines[start + 1:end])
    told = "".join(line[3:] for line in lines[start:end])
    whole = printable("".join(p.x_text for p in view.positions))
    assert re.sub(r"\s", "", told) == re.sub(r"\s", "", whole)


def test_breaks_keep_every_character_in_order_within_the_width():
    rng = random.Random(0)
    alphabet = ["a", "bb", " ", "  ", "漢", "e\u0301", "word", "·", "x" * 90, "⟨×12⟩"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80)))
        width, indent = rng.randrange(4, 40), rng.randrange(0, 3)
        offsets = break_offsets(text, width, indent)
        assert offsets == sorted(set(offsets)) and all(0 < o < len(text) for o in offsets)
        bounds = [0, *offsets, len(text)]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
            room = width - (indent if i else 0)
            assert columns(text[a:b].rstrip()) <= room, (text, width, indent, text[a:b])
        counts = [m.span() for m in re.finditer(r"⟨×\d+⟩", text)  # a count stays whole,
                  if columns(m.group()) <= width - indent]  # where it fits a line
        assert not any(a < o < b for o in offsets for a, b in counts)


def test_a_middle_dot_stays_with_the_word_before_it():
    text = "model-name · document · action"
    lines = [text[a:b] for a, b in zip([0, *break_offsets(text, 14)],
                                       [*break_offsets(text, 14), len(text)], strict=True)]
    assert [line.rstrip() for line in lines] == ["model-name ·", "document ·", "action"]


def test_clips_count_wide_characters_and_keep_the_marked_span():
    assert clip("漢字漢字", 5) == "漢字…" and clip("abc", 3) == "abc"
    assert columns(clip("漢" * 50, 11)) <= 11
    context = "a" * 40 + "⟦tok⟧" + "b" * 40
    cut = clip_around(context, 21, 40, 45)
    assert "⟦tok⟧" in cut and cut.startswith("…a") and cut.endswith("b…") and columns(cut) == 21
    assert clip_around("⟦" + "t" * 30 + "⟧", 10, 0, 32) == "⟦tttttttt…"


def test_the_reports_example_of_a_long_generation_says_what_is_folded_and_marked():
    """The report's Examples read in a browser: the same view folded, each ✂ on both sides
    and said what it marks, and long unbroken names or tokens wrap inside the two columns."""
    from kvdrift.report.page import CSS, generations

    html = generations(long_view())
    assert html.count('<span class="cut"') == 2 * len(CUTS)
    assert html.count('class="tau"') == 2 and "of 1,000 positions" in html
    assert (f"✂ before a token: the first position read from Q&#x27;s cache after a "
            f"decoding-time compression ({len(CUTS)} within H") in html
    assert "\x1b" not in html
    # grid columns that may shrink below their longest word, and words that may break
    example = re.search(r"\.example \{([^}]*)\}", CSS).group(1)
    sides = re.search(r"\.example \.sides \{([^}]*)\}", CSS).group(1)
    assert "overflow-wrap: anywhere" in example and "minmax(0, 1fr) minmax(0, 1fr)" in sides
