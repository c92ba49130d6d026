"""The tutorial notebook (docs/tutorial.ipynb) runs top to bottom on the embedded model, and
what it shows is what it says: three actions measured, a P(tau <= t) figure, one divergence
read token by token."""

from pathlib import Path

import pytest

from tests.conftest import ONE_TASK_PER_FAMILY

#: Run before the notebook's own cells, in its kernel: every cell runs as written, on three of
#: the six default documents.
FEWER_DOCUMENTS = f"""from kvdrift import study_config

study_config.DEFAULT_DOCUMENTS = study_config.DEFAULT_DOCUMENTS | {ONE_TASK_PER_FAMILY!r}
"""
NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "tutorial.ipynb"


@pytest.mark.slow
def test_the_tutorial_runs_end_to_end(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(FEWER_DOCUMENTS))
    notebook.cells.append(nbformat.v4.new_code_cell(
        'print("documents:", result.records.replicates["doc_id"].nunique())'))
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
    assert "documents: 3\n" in text
