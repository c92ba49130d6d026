"""Results print short and show curated in a notebook; one header per quantity across
``kvdrift run``, ``kvdrift study`` and Python, with one legend; readings of a bootstrap draw
without positions are NaN without a RuntimeWarning."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from kvdrift.analysis import legend
from kvdrift.analysis.interval import Interval
from kvdrift.analysis.readings import derive_readings
from kvdrift.analysis.results import ActionResult, StudyAnalysis, StudyMeta
from kvdrift.directory import Records
from kvdrift.measurement import Measurement
from kvdrift.notebook import curated_frame, size_text
from kvdrift.report.terminal import RUN_DRAFT_LENGTH, run_table, summary_table

H = 32


def _iv(estimate: float, lo: float, hi: float) -> Interval:
    return Interval(estimate, lo, hi, 0.95)


def _analysis() -> StudyAnalysis:
    scalars = {"p_diverge": _iv(0.875, 0.75, 0.9583), "R": _iv(0.431, 0.354, 0.5),
               "R_tv": _iv(0.429, 0.36, 0.489), "E": _iv(0.445, 0.378, 0.507),
               "C": _iv(0.906, 0.876, 0.928), "R_minus_F": _iv(0.327, 0.276, 0.377),
               "B": _iv(0.029, -0.006, 0.09)}
    actions = tuple(ActionResult("smollm2", name, 6, scalars, kv_bytes=4718592.0,
                                 kv_fraction=0.5) for name in ("snapkv-half", "recent-half"))
    meta = StudyMeta(estimator="rollout", horizon=H, replicates=4, bootstrap=200, alpha=0.05,
                     documents={"niah": 2, "vt": 2, "cwe": 2})
    return StudyAnalysis(meta, actions=actions)


def _measurement() -> Measurement:
    steps = pd.DataFrame({"t": np.arange(1000)})
    replicates = pd.DataFrame({"tau": np.arange(48)})
    return Measurement(Records(steps, replicates, {}, {}), _analysis())


def test_a_measurement_prints_a_line_and_its_table_not_its_records():
    text = repr(_measurement())
    lines = text.splitlines()
    assert lines[0] == ("Measurement(smollm2: snapkv-half, recent-half; 6 documents, K = 4, "
                        "H = 32, rollout; in memory)")
    assert len(lines) == 4 and "DataFrame" not in text and "steps=" not in text
    assert "87.5 [75.0, 95.8]" in text and "4.5 MiB" in text
    assert repr(_measurement().records) == "Records(steps: 1,000 rows, replicates: 48 rows)"
    assert repr(_analysis()).startswith("StudyAnalysis(smollm2: snapkv-half, recent-half;")


def test_the_notebook_table_is_curated_estimate_and_interval_with_sizes():
    frame = curated_frame(_analysis())
    assert list(frame.columns[:4]) == ["model", "action", "KV cache", "kv_fraction"]
    row = frame.iloc[0]
    assert row["KV cache"] == "4.5 MiB" and row["kv_fraction"] == "0.500"
    assert row["P(τ≤32) (%)"] == "87.5 [75.0, 95.8]"
    assert row["R (%)"] == "43.1 [35.4, 50.0]" and row["B(a) (pp)"] == "2.9 [-0.6, 9.0]"
    page = _measurement()._repr_html_()
    assert "P(τ≤32) (p_diverge): share of replicates" in page
    assert "B(a) (B): late-minus-early" in page and "to_frame() holds the numbers" in page
    assert [size_text(v) for v in (512, 2048, 3 * 2**30, math.nan)] == [
        "512 B", "2.0 KiB", "3.0 GiB", "—"]


def _headers(table) -> list[str]:
    return [str(c.header) for c in table.columns]


def test_one_header_per_quantity_in_run_study_and_python():
    analysis = _analysis()
    shown = legend.header("p_diverge", H)
    assert shown == "P(τ≤32)"
    assert shown in _headers(run_table(analysis))
    assert f"{shown}\n(%)" in _headers(summary_table(analysis))
    assert f"{shown} (%)" in curated_frame(analysis).columns
    assert f"tok/round({RUN_DRAFT_LENGTH})" in _headers(run_table(analysis))


@pytest.mark.parametrize("table", [run_table, summary_table])
def test_the_terminal_tables_carry_the_legend(table):
    console = Console(record=True, width=200)
    console.print(table(_analysis()))
    text = console.export_text()
    assert "P(τ≤32) (p_diverge): share of replicates" in text
    wanted = (["F: fixed-history", "accept (acceptance): speculative",
               "tok/round(4) (tokens_per_round):"] if table is run_table
              else ["B(a) (B): late-minus-early"])
    for line in wanted:
        assert line in text, line
    assert "P(tau<=H)" not in text


def test_a_model_prints_its_name_class_size_device_and_dtype(tiny_llama):
    from kvdrift.lm.loading.user_model import Model

    class Tokenizer:
        def encode(self, text):
            return [1]

    text = repr(Model(tiny_llama, Tokenizer(), "tiny"))
    assert re.fullmatch(r"Model\('tiny': LlamaForCausalLM, 0M parameters, cpu, torch\.float32\)",
                        text), text


def test_readings_of_a_draw_without_positions_are_nan_and_silent():
    """A bootstrap draw that holds no document of a stratum (question documents are drawn by
    their shared context) has no positions: its readings are NaN, without a RuntimeWarning."""
    m = {"positions": np.array([[4.0], [0.0]]), "spec_rejections": np.array([[1.0], [0.0]]),
         "spec_first_round": np.array([[0.5], [0.0]]),
         "spec_rounds": np.array([[2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0]]),
         "tf_kl": np.array([[0.4], [0.0]]), "tf_top1": np.array([[4.0], [0.0]]),
         "tf_dp": np.array([[0.0], [0.0]]), "tf_logratio": np.array([[0.4], [0.0]])}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = derive_readings(m)
    assert out["acceptance"][0] == 0.75 and math.isnan(out["acceptance"][1])
    assert out["kl"][0] == pytest.approx(0.1) and math.isnan(out["kl"][1])


def test_showing_a_result_leaves_the_notebooks_figures_alone():
    """The curated table does not import the report (which sets matplotlib's backend to Agg:
    a notebook's plt.show() would then show nothing, as the tutorial's test found)."""
    import inspect
    import subprocess
    import sys

    code = "\n".join([
        "import sys", "import numpy as np, pandas as pd",
        "from kvdrift.analysis.interval import Interval",
        "from kvdrift.analysis.results import ActionResult, StudyAnalysis, StudyMeta",
        "from kvdrift.directory import Records", "from kvdrift.measurement import Measurement",
        f"H = {H}", inspect.getsource(_iv), inspect.getsource(_analysis),
        inspect.getsource(_measurement),
        "m = _measurement(); m._repr_html_(); repr(m); m.analysis._repr_html_()",
        "shown = sorted(n for n in sys.modules if n.startswith('kvdrift.report'))",
        "assert not shown, shown"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
