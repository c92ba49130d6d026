"""The tutorial notebook (docs/tutorial.ipynb) runs top to bottom on the embedded model, and
what it shows is what it says: three actions measured, a P(tau <= t) figure, one divergence
read token by token. Run as committed, it prints what is committed: a change to the code that
moves its numbers fails here until the notebook is run again and committed with its outputs
(``nbclient``, see docs/development.md)."""

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "tutorial.ipynb"


def shown(cell) -> list[tuple[str, str]]:
    """What a code cell shows as text: printed lines and results (an image only as one)."""
    out = []
    for o in cell.outputs:
        if o.output_type == "stream" and o.name == "stdout":
            out.append(("stdout", o.text))
        elif o.output_type in ("execute_result", "display_data"):
            data = o.get("data", {})
            out.append(("image", "") if "image/png" in data else
                        ("result", data.get("text/html") or data.get("text/plain", "")))
        elif o.output_type == "error":
            out.append(("error", "\n".join(o.traceback)))
    return out


@pytest.mark.slow
def test_the_tutorial_runs_end_to_end_and_shows_what_is_committed(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    committed = nbformat.read(NOTEBOOK, as_version=4)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=1200, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in notebook.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                     for o in outputs)
    for action in ("snapkv-half", "recent-half", "vnorm-half"):
        assert action in text, action
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1  # the P(tau <= t) plot
    assert "tau = " in text and "\nP: " in text and "\nQ: " in text
    assert list(tmp_path.iterdir()) == []  # the measurement stayed in memory
    before = [c for c in committed.cells if c.cell_type == "code"]
    for i, (now, then) in enumerate(zip(code, before, strict=True)):
        assert shown(now) == shown(then), (
            f"code cell {i + 1} shows other outputs than committed: run the notebook again "
            f"(nbclient) and commit it with its outputs")
