"""Seeing the generations: the trajectory frame, the examples rule and ``kvdrift show``.

The run is the tiny random Llama saved with the embedded SmolLM2 tokenizer
(``tiny_model_dir``), so the records are a real run's; every token is decoded here again,
independently, with that tokenizer loaded by transformers, and compared with what the frame
holds and what ``show`` prints.
"""

from __future__ import annotations

import re
from itertools import takewhile

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.data import Document, write_jsonl
from kvdrift.examples.decoding import token_text
from kvdrift.examples.selection import choose_examples, named_examples
from kvdrift.text import printable

runner = CliRunner()
H, K = 6, 3
#: Markup, an ampersand, ESC (a terminal's clear screen), NUL and a right-to-left override.
HOSTILE = "<script>alert(1)</script> &amp; \x1b[2J \x00 \u202egnp.exe "


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("examples")
    docs = base / "docs.jsonl"
    write_jsonl([Document(id=f"d{i}", prompt=f"Note {i}. " + "The cat sat on the mat. " * 20)
                 for i in range(2)] + [Document(id="hostile", prompt=HOSTILE * 12)], docs)
    out = base / "run"
    result = runner.invoke(app, ["run", "--model", str(tiny_model_dir), "--docs", str(docs),
                                 "--actions", "full,snapkv-half,recent-half", "--replicates",
                                 str(K), "--horizon", str(H), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)


def _steps(run):
    return pq.read_table(run / "steps").to_pandas()


def _replicates(run):
    return pq.read_table(run / "replicates").to_pandas()


def test_trajectory_frame_holds_the_records_decoded_by_the_runs_tokenizer(tiny_run, tokenizer):
    import kvdrift

    frame = kvdrift.trajectories(tiny_run)
    steps = _steps(tiny_run)
    assert len(frame) == len(steps) == 3 * 3 * K * H
    key = ["doc_id", "action", "replicate", "t"]
    merged = frame.merge(steps[[*key, "x_token", "y_token", "delta", "mismatch"]], on=key,
                         suffixes=("", "_rec"), validate="one_to_one")
    assert (merged["x_token"] == merged["x_token_rec"]).all()
    assert (merged["delta"] == merged["delta_rec"]).all()
    assert merged["x_text"].tolist() == [tokenizer.decode([int(i)]) for i in merged["x_token"]]
    assert merged["y_text"].tolist() == [tokenizer.decode([int(i)]) for i in merged["y_token"]]
    reps = _replicates(tiny_run).set_index(["doc_id", "action", "replicate"])
    for (doc, action, r), rows in frame.groupby(["doc_id", "action", "replicate"]):
        rec = reps.loc[(doc, action, r)]
        assert (rows["tau"] == rec["tau"]).all() and (rows["R"] == rec["risk"]).all()
        assert (rows["R_tv"] == rec["risk_tv"]).all()
        first = rows[rows["mismatch"]]["t"].min() if rows["mismatch"].any() else 0
        assert first == rec["tau"]  # the recorded tau is the first position they differ


def _blocks(text: str) -> list[list[str]]:
    """show's views (blank lines between them), each heading's wrapped lines joined into its
    first line (show writes within 80 columns; a model path makes the heading wrap)."""
    blocks = []
    for view in text.strip("\n").split("\n\n"):
        lines = view.splitlines()
        end = next(i for i, line in enumerate(lines) if line.startswith(("tau = ", "J = ")))
        blocks.append([" ".join(line.strip() for line in lines[:end]), *lines[end:]])
    return blocks


def _check_block(block, steps, reps, tokenizer):
    heading = re.match(r"(.+) · (.+) · (.+) · replicate (\d+)\s+\((.+)\)$", block[0])
    assert heading, block[0]
    _, doc, action, r = heading.groups()[:4]
    rep = reps[(reps.doc_id == doc) & (reps.action == action) & (reps.replicate == int(r))]
    tau, risk = int(rep["tau"].iloc[0]), float(rep["risk"].iloc[0])
    mine = steps[(steps.doc_id == doc) & (steps.action == action)
                 & (steps.replicate == int(r))].sort_values("t")
    summary = f"R = {risk:.3f}"
    assert summary in block[1] and (f"tau = {tau}," in block[1] if tau else "never" in block[1])
    rows = [line for line in block if re.match(r"^(τ▶|  ) +\d+  '", line)]
    assert len(rows) == H
    for line, step in zip(rows, mine.itertuples(), strict=True):
        assert int(line[3:6]) == step.t
        assert line.startswith("τ▶") == (step.t == tau)
        p = f"'{printable(tokenizer.decode([step.x_token]))}'"
        q = f"'{printable(tokenizer.decode([step.y_token]))}'"
        rest = line[8:]
        assert rest.startswith(p), (line, p)
        assert rest[len(p):].lstrip(" ").startswith(q), (line, q)
        assert line.rstrip().endswith("≠") == bool(step.mismatch)
        assert f" {step.delta:.2f}" in line
    return action, tau


def test_show_prints_each_actions_aligned_continuations_as_recorded(tiny_run, tokenizer):
    result = runner.invoke(app, ["show", str(tiny_run)])
    assert result.exit_code == 0, result.output
    assert "\x1b[" not in result.stdout  # not a terminal: no colours
    steps, reps = _steps(tiny_run), _replicates(tiny_run)
    shown = [_check_block(b, steps, reps, tokenizer) for b in _blocks(result.stdout)]
    assert {a for a, _ in shown} == {"full", "snapkv-half", "recent-half"}
    expected = choose_examples(reps)
    assert [(e.action, e.tau) for e in expected] == shown
    assert all(tau == 0 for a, tau in shown if a == "full")
    diverged = reps[(reps.action == "snapkv-half") & (reps.tau > 0)]
    assert min(t for a, t in shown if a == "snapkv-half") == diverged["tau"].min()
    assert "prompt ends: …" in result.stdout and "assistant" in result.stdout


def test_show_selects_by_name_and_refuses_unknown_names(tiny_run, tokenizer):
    result = runner.invoke(app, ["show", str(tiny_run), "--doc", "d1", "--action",
                                 "recent-half", "--replicate", "2", "--prompt-tokens", "0"])
    assert result.exit_code == 0, result.output
    blocks = _blocks(result.stdout)
    assert len(blocks) == 1
    assert re.search(r"d1 · recent-half · replicate 2\s+\(as asked\)$", blocks[0][0])
    _check_block(blocks[0], _steps(tiny_run), _replicates(tiny_run), tokenizer)
    assert "prompt ends" not in result.stdout
    for args, words in ((["--doc", "d9"], "document in the run's records must be one of d0, d1,"),
                        (["--action", "snap"], "action in the run's records must be one of"),
                        (["--replicate", "7"], "replicate must be an index 0..2"),
                        (["--prompt-tokens", "-1"], "--prompt-tokens must be")):
        bad = runner.invoke(app, ["show", str(tiny_run), *args])
        assert bad.exit_code == 2 and words in bad.output and "Traceback" not in bad.output


def test_examples_rule_earliest_median_never():
    reps = pd.DataFrame({
        "model": "m", "action": ["a"] * 6 + ["full"] * 2,
        "doc_id": ["d0", "d0", "d1", "d1", "d2", "d2", "d0", "d1"],
        "replicate": [0, 1, 0, 1, 0, 1, 0, 0],
        "tau": [5, 0, 3, 9, 3, 7, 0, 0]})
    picks = choose_examples(reps, ("earliest", "median", "never"))
    # diverged in (tau, doc, replicate) order: (3,d1,0) (3,d2,0) (5,d0,0) (7,d2,1) (9,d1,1)
    assert [(e.action, e.doc_id, e.replicate, e.role) for e in picks] == [
        ("a", "d1", 0, "earliest"), ("a", "d0", 0, "median"), ("a", "d0", 1, "never"),
        ("full", "d0", 0, "never")]
    assert [e.role for e in choose_examples(reps)] == ["earliest", "median", "never"]
    one = named_examples(reps, "d2", "a", None)
    # two diverged (tau 3, 7): the lower median is the earliest, shown once
    assert [(e.doc_id, e.replicate, e.role) for e in one] == [("d2", 0, "earliest")]


def test_a_model_without_its_tokenizer_is_shown_as_token_ids(tmp_path):
    texts = token_text(str(tmp_path / "gone"))
    assert texts.tokenizer is None and texts.piece(42) == "[42]" and texts.piece(-1) == ""
    assert "not available" in texts.note and "token ids" in texts.note
    assert "\n" not in texts.note


def _no_raw_controls(html: str) -> None:
    assert not any(c in html for c in ("\x1b", "\x00", "\u202e")), "a raw control character"


def test_generations_render_hostile_text_as_text():
    from kvdrift.examples.selection import Example
    from kvdrift.examples.views import ExampleView, Position
    from kvdrift.report.page import generations

    view = ExampleView(
        Example("m", "doc <b>&", "snapkv-half", 0, 2, "earliest"), "rollout", 3, 2 / 3, 0.4,
        (Position(1, "<script>", "<script>", False, 0.0),
         Position(2, " &amp; \x1b[2J", "\u202egnp.exe\x00", True, 0.5),
         Position(3, "</div>", "'\"", True, 1.0)), prompt_tail=HOSTILE)
    html = generations(view)
    _no_raw_controls(html)
    assert "<script" not in html and "</div>\"" not in html
    assert html.count("&lt;script&gt;") == 3 and "&amp;amp;" in html  # two tokens, the prompt
    assert "\\x1b[2J" in html and "\\u202egnp.exe\\x00" in html  # visible escapes
    assert "doc &lt;b&gt;&amp;" in html
    assert html.count('<span class="tau">τ</span>') == 2  # before t = 2 on both sides
    assert html.count('class="tok mis"') == 4
    assert "rgba(198, 40, 40, 0.275)" in html and "rgba(198, 40, 40, 0.550)" in html


def test_report_has_examples_of_every_action_escaped(tiny_run):
    from html.parser import HTMLParser

    from kvdrift.directory import StudyDirectory
    from kvdrift.examples.gather import gather_examples
    from kvdrift.examples.selection import Example
    from kvdrift.report.page import generations
    from kvdrift.report.sections.examples import action_example_html

    report = runner.invoke(app, ["report", str(tiny_run), "--bootstrap", "20"])
    assert report.exit_code == 0, report.output
    html = (tiny_run / "report" / "report.html").read_text(encoding="utf-8")
    _no_raw_controls(html)
    examples = html[html.index('<section id="examples">'):]
    examples = examples[:examples.index("</section>")]
    for action in ("full", "snapkv-half", "recent-half"):
        assert f" · {action}</h3>" in examples
    assert examples.count('class="example"') >= 5  # full: one; the others: one or two each

    class Tags(HTMLParser):
        tags: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)

    parser = Tags()
    parser.feed(html)
    assert "script" not in parser.tags  # the page has no script of its own, nor the model's

    directory = StudyDirectory(tiny_run)
    reps = _replicates(tiny_run)
    tau = int(reps[(reps.doc_id == "hostile") & (reps.action == "recent-half")
                   & (reps.replicate == 0)]["tau"].iloc[0])
    found = gather_examples(directory, [Example(str(reps.model[0]), "hostile", "recent-half", 0,
                                                tau, "chosen")], prompt_tokens=40)
    view = found.views[0]
    assert "<script>" in view.prompt_tail and "\u202e" in view.prompt_tail
    block = generations(view)
    _no_raw_controls(block)
    assert "alert(1)&lt;/script&gt; &amp;amp; \\x1b[2J \\x00 \\u202egnp.exe" in block
    one = action_example_html(tiny_run, "snapkv-half")
    assert one.count('class="example"') == 1 and "median divergence" in one


def test_attribution_is_recorded_shown_and_part_of_the_settings(tiny_model_dir, tmp_path,
                                                                tokenizer):
    from kvdrift.lm.loading.model import encode_prompt

    docs = tmp_path / "docs.jsonl"
    prompt = "Remember the code 4417. " + "The cat sat on the mat. " * 12
    write_jsonl([Document(id="d0", prompt=prompt)], docs)
    out = tmp_path / "run"
    args = ["run", "--model", str(tiny_model_dir), "--docs", str(docs), "--actions",
            "full,recent-half", "--replicates", "3", "--horizon", "4", "--out", str(out)]
    result = runner.invoke(app, [*args, "--attribution"])
    assert result.exit_code == 0, result.output
    reps = _replicates(out)
    full, recent = reps[reps.action == "full"], reps[reps.action == "recent-half"]
    assert full["lost_mass"].isna().all() and all(len(p) == 0 for p in full["lost_positions"])
    diverged = recent[recent.tau > 0]
    assert len(diverged) > 0 and recent[recent.tau == 0]["lost_mass"].isna().all()
    ids = encode_prompt(tokenizer, prompt)[0].tolist()
    for row in diverged.itertuples():
        positions, shares = list(row.lost_positions), list(row.lost_shares)
        assert 0 < row.lost_mass <= 1 and 0 < len(positions) <= 5
        assert len(set(positions)) == len(positions) and all(0 <= j < len(ids) for j in positions)
        assert shares == sorted(shares, reverse=True) and sum(shares) <= row.lost_mass + 1e-9
        assert list(row.lost_tokens) == [tokenizer.decode([ids[j]]) for j in positions]
        assert all(f"⟦{t}⟧" in c for t, c in zip(row.lost_tokens, row.lost_contexts,
                                                   strict=True))
        kept = len(ids) // 2  # recent-half: 4 sink tokens and the most recent ones
        assert all(4 <= j < len(ids) - (kept - 4) for j in positions)  # only evicted ones

    shown = runner.invoke(app, ["show", str(out), "--action", "recent-half"])
    assert shown.exit_code == 0, shown.output
    first = diverged.sort_values(["tau", "doc_id", "replicate"]).iloc[0]
    assert f"{100 * first.lost_mass:.1f}% of P's attention at tau" in shown.stdout
    assert f"'{printable(first.lost_tokens[0])}'" in shown.stdout

    from kvdrift.report.sections.examples import action_example_html

    html = action_example_html(out, "recent-half")
    assert "<strong>Lost at &tau;:</strong>" in html and html.count("<li>") >= 1

    write_jsonl([Document(id="d0", prompt=prompt + " Changed.")], docs)  # the file changed
    changed = runner.invoke(app, ["show", str(out), "--action", "recent-half"])
    assert changed.exit_code == 0 and changed.stdout == shown.stdout  # the store's prompt
    write_jsonl([Document(id="d0", prompt=prompt)], docs)

    again = runner.invoke(app, args)  # the same run without --attribution: refused
    assert again.exit_code == 2 and "attribution" in again.output
    swrb = runner.invoke(app, [*args[:-2], "--out", str(tmp_path / "swrb"), "--estimator",
                               "swrb", "--attribution"])
    assert swrb.exit_code == 2 and "attribution must be false with estimator 'swrb'" in \
        swrb.output


def test_attribution_is_a_study_setting_recorded_only_when_on():
    from kvdrift.api import shipped_config
    from kvdrift.run.runner import RunConfig
    from kvdrift.study_config import load_study, recorded_study

    on = load_study(shipped_config("cpu-demo"), {"attribution": True})
    off = load_study(shipped_config("cpu-demo"))
    assert on.run.attribution and not off.run.attribution
    assert on.as_dict()["attribution"] is True and "attribution" not in off.as_dict()
    assert recorded_study(on.as_dict()) == on and recorded_study(off.as_dict()) == off
    doc = Document(id="d", prompt="p")
    assert RunConfig(attribution=True).fingerprint(doc)["attribution"] is True
    assert "attribution" not in RunConfig().fingerprint(doc)  # stores before it still resume
    from kvdrift.run.fingerprint import first_difference

    plain, with_it = RunConfig().fingerprint(doc), RunConfig(attribution=True).fingerprint(doc)
    assert first_difference(plain, plain) is None
    assert first_difference(plain, with_it) == ("it was computed with attribution = False, "
                                                "this run has attribution = True")
    assert "attribution = True, this run has attribution = False" in first_difference(
        with_it, plain)
    with pytest.raises(ValueError, match=r"\[study\].attribution must be true or false"):
        load_study(shipped_config("cpu-demo"), {"attribution": "yes"})


@pytest.mark.slow
def test_show_on_a_small_demo_prints_the_records_and_rebuilt_prompts(tmp_path):
    """The demo's study (SmolLM2, generated RULER tasks, one per family) at K = 2, H = 8 with
    attribution: show's tokens are the tokenizer's decoding of the records, its prompts are the
    ones the units ran on (their fingerprints' hashes), the lost tokens are the prompts'
    tokens."""
    from transformers import AutoTokenizer

    import kvdrift
    from kvdrift.directory import StudyDirectory
    from kvdrift.lm.loading.model import encode_prompt, smollm2_path
    from kvdrift.run.fingerprint import prompt_sha256
    from kvdrift.study import fixed_documents, model_documents

    shipped = kvdrift.shipped_config("cpu-demo").read_text(encoding="utf-8")
    assert shipped.count("\nper_stratum = 2\n") == 1
    demo = tmp_path / "cpu-demo.toml"  # three of its six documents
    demo.write_text(shipped.replace("\nper_stratum = 2\n", "\nper_stratum = 1\n"),
                    encoding="utf-8")
    config = kvdrift.load_study(demo, replicates=2, horizon=8, depths=[4], attribution=True)
    out = kvdrift.run_study(config, tmp_path / "demo")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path(), local_files_only=True)
    result = runner.invoke(app, ["show", str(out), "--prompt-tokens", "16"])
    assert result.exit_code == 0, result.output
    steps, reps = _steps(out), _replicates(out)
    H_demo = 8
    blocks = _blocks(result.stdout)
    assert {b[0].split(" · ")[2] for b in blocks} == {"snapkv-half", "recent-half"}
    directory = StudyDirectory(out)
    docs = {d.id: d for d in model_documents(config, fixed_documents(config), tokenizer)}
    for block in blocks:
        _, doc, action, rest = block[0].split(" · ")
        r = int(rest.split()[1])
        rows = [line for line in block if re.match(r"^(τ▶|  ) +\d+  '", line)]
        mine = steps[(steps.doc_id == doc) & (steps.action == action)
                     & (steps.replicate == r)].sort_values("t")
        tau = int(reps[(reps.doc_id == doc) & (reps.action == action)
                       & (reps.replicate == r)]["tau"].iloc[0])
        assert len(rows) == H_demo
        for line, step in zip(rows, mine.itertuples(), strict=True):
            assert line.startswith("τ▶") == (step.t == tau)
            p = f"'{printable(tokenizer.decode([step.x_token]))}'"
            q = f"'{printable(tokenizer.decode([step.y_token]))}'"
            assert line[8:].startswith(p) and line[8:][len(p):].lstrip(" ").startswith(q)
        stored = directory.unit_fingerprint("smollm2", doc, action)["prompt_sha256"]
        assert prompt_sha256(docs[doc].prompt) == stored
        ids = encode_prompt(tokenizer, docs[doc].prompt)[0].tolist()
        tail = printable(tokenizer.decode(ids[-16:]))
        start = next(i for i, line in enumerate(block) if line.startswith("prompt ends: …"))
        wrapped = [block[start], *takewhile(lambda line: re.match(r"^  \S", line),
                                            block[start + 1:])]
        assert re.sub(r"\s", "", "".join(wrapped)) == re.sub(r"\s", "", f"prompt ends: …{tail}")
    diverged = reps[reps.tau > 0]
    assert len(diverged) and diverged["lost_mass"].between(0, 1).all()
    for row in diverged.itertuples():
        ids = encode_prompt(tokenizer, docs[row.doc_id].prompt)[0].tolist()
        assert list(row.lost_tokens) == [tokenizer.decode([ids[j]]) for j in row.lost_positions]


def test_a_run_whose_tokenizer_is_gone_shows_token_ids_and_says_so(tiny_model_dir, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id="d0", prompt="The cat sat on the mat. " * 12)], docs)
    out = tmp_path / "run"
    ran = runner.invoke(app, ["run", "--model", str(model), "--docs", str(docs), "--actions",
                              "recent-half", "--replicates", "2", "--horizon", "3", "--out",
                              str(out)])
    assert ran.exit_code == 0, ran.output
    shutil.rmtree(model)
    shown = runner.invoke(app, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    notes = [line for line in shown.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "tokenizer" in notes[0] and "token ids are shown" in notes[0]
    steps = _steps(out)
    [block] = _blocks(shown.stdout)
    r = int(block[0].split(" · replicate ")[1].split()[0])
    rows = [line for line in block if re.match(r"^(τ▶|  ) +\d+  '", line)]
    mine = steps[steps.replicate == r].sort_values("t")
    assert [line[8:].split()[:2] for line in rows] == [
        [f"'[{s.x_token}]'", f"'[{s.y_token}]'"] for s in mine.itertuples()]
    assert "prompt ends" not in shown.stdout
