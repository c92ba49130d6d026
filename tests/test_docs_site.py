"""The README and the documentation pages say what the code does: every `kvdrift` command line
they show parses against the command's own options, each command page lists exactly the
command's options, the shared examples are the same text, the README stays short, and the
tutorial is committed as run top to bottom with its outputs."""

import functools
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
COMMANDS = ("finite-state", "run", "study", "report", "show", "predict", "plan", "frontier",
            "actions")


@functools.cache
def cli():  # the typer app as a click group (typer ships its own click)
    from kvdrift.cli import app

    return typer.main.get_command(app)


def blocks(text: str, kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", text, flags=re.S)


def command_lines(path: Path) -> list[list[str]]:
    """Each `kvdrift ...` line of the page's bash blocks, comments dropped, as words."""
    lines = []
    for block in blocks(path.read_text(encoding="utf-8"), "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "kvdrift":
                lines.append(words[1:])
    return lines


def documented_lines() -> list[tuple[str, list[str]]]:
    return [(path.relative_to(ROOT).as_posix(), words)
            for path in [ROOT / "README.md", *PAGES] for words in command_lines(path)]


def test_the_pages_show_command_lines_of_every_command():
    shown = {words[0] for _, words in documented_lines()}
    assert shown >= set(COMMANDS) - {"actions"} | {"actions"} & shown
    assert set(COMMANDS) - {"actions"} <= shown


@pytest.mark.parametrize("where, words", documented_lines(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_each_documented_command_line_parses(where, words):
    group = cli()
    assert words[0] in group.commands, f"{where}: no command {words[0]!r}"
    command = group.commands[words[0]]
    try:  # options and their types as the command declares them; nothing runs
        command.make_context(words[0], list(words[1:]))
    except Exception as error:  # typer's click raises its own UsageError: no such option, ...
        message = error.format_message() if hasattr(error, "format_message") else str(error)
        pytest.fail(f"{where}: kvdrift {' '.join(words)}: {message}")


def option_names(command) -> set[str]:
    names = set()
    for param in command.params:
        if param.name == "help":
            continue
        if param.param_type_name == "argument":  # as --help names it
            names.add(param.metavar or param.name.upper())
        else:
            names |= {n for n in param.opts + param.secondary_opts}
    return names


def table_options(page: Path) -> set[str]:
    """The first cells of the page's "Options" table (`--x` / `--no-x` split, ARGS kept)."""
    text = page.read_text(encoding="utf-8")
    if "\n## Options\n" not in text:
        return set()
    section = text.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for row in re.findall(r"^\| (.+?) \|", section, flags=re.M)[2:]:
        names |= set(re.findall(r"`([^`]+)`", row))
    return names


@pytest.mark.parametrize("name", [c for c in COMMANDS if c != "actions"])
def test_each_command_page_lists_exactly_its_options(name):
    page = DOCS / "commands" / f"{name}.md"
    assert table_options(page) == option_names(cli().commands[name]), name


def test_the_overview_and_the_readme_name_every_command():
    overview = (DOCS / "commands" / "index.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"`kvdrift {name}" in overview and f"`kvdrift {name}" in readme, name
        assert (DOCS / "commands" / f"{name}.md").is_file()
    assert set(cli().commands) == set(COMMANDS)


def test_the_readme_is_short_and_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    first = blocks(readme, "bash")[0].splitlines()
    assert [line.split("#")[0].strip() for line in first] == [
        "bash scripts/demo.sh", "bash scripts/test.sh --all"]
    image = re.search(r"!\[[^\]]*\]\((docs/images/[^)]+\.png)\)", readme).group(1)
    assert (ROOT / image).read_bytes().startswith(b"\x89PNG")
    assert not re.search(r"\bissue \d|\(issue|formerly|the former ", readme, flags=re.I)


def test_user_pages_carry_no_issue_numbers_or_history():
    own = [p for p in PAGES if p.name not in {"method.md", "engine.md", "architecture.md",
                                                   "replication.md", "finite-state.md",
                                                   "mutation.md"}]
    for page in own:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\bissue \d|\(issue|formerly|the former ", text, flags=re.I), page


def test_the_own_press_page_shows_the_readmes_code():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Measure your own press\n", 1)[1].split("\n## ", 1)[0]
    page = (DOCS / "own-press.md").read_text(encoding="utf-8")
    for kind in ("python", "bash"):
        assert blocks(section, kind) == blocks(page, kind), kind


def test_the_study_file_on_the_studies_page_loads(tmp_path):
    from kvdrift.study_config import load_study

    (toml,) = blocks((DOCS / "studies.md").read_text(encoding="utf-8"), "toml")
    tomllib.loads(toml)
    path = tmp_path / "study.toml"
    path.write_text(toml, encoding="utf-8")
    config = load_study(path)
    assert config.models == ("smollm2",) or list(config.models) == ["smollm2"]
    assert config.run.horizon == 32 and config.run.replicates == 4
    assert config.analysis.endpoints


def test_the_tutorial_is_committed_run_top_to_bottom_with_its_outputs():
    notebook = json.loads((DOCS / "tutorial.ipynb").read_text(encoding="utf-8"))
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the P(tau <= t) figure
    sources = ["".join(c["source"]) for c in code]
    silent = [s for s, c in zip(sources, code, strict=True) if not c["outputs"]]
    assert silent == [s for s in sources if s.startswith("from dataclasses")]  # the press only


def test_the_readmes_links_and_images_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert len(local) >= 15  # the site's pages, the changelog and the figure
    for target in local:
        assert (ROOT / target).is_file(), target
