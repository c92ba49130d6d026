"""The study report: figures, HTML, JSON and the terminal table on a fake analysis."""

from __future__ import annotations

import copy
import io
import json
import math
from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
import pytest
from rich.console import Console

from kvdrift.analysis.interval import Interval
from kvdrift.analysis.readings import (
    SpeculativeNumbers,
    SpeculativeResult,
    TeacherForcedNumbers,
    TeacherForcedResult,
)
from kvdrift.analysis.results import ActionResult, StudyAnalysis, StudyMeta
from kvdrift.json_values import to_json_safe
from kvdrift.report import summary_table, write_report
from kvdrift.report.figures import (
    FIGURES,
    plot_contrasts,
    plot_expected_delta,
    plot_lag_profiles,
    plot_timing,
    risk_memory_points,
)
from kvdrift.report.numbers import interval_text
from kvdrift.report.terminal import print_whole, run_rows, run_table

H = 32
MODELS = ("Llama-3.1-8B-Instruct", "Qwen2.5-7B-Instruct")
ACTIONS = ("snapkv-512", "snapkv-half", "recent-half")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLE_HEADINGS = ("What was run", "Headline numbers", "Contrasts", "Prespecified endpoints",
                  "Finite-window bounds", "Certified orderings", "EOS split", "EOS contrasts",
                  "Local agreement within branches", "Task outcomes",
                  "Teacher-forced and speculative readings", "Per stratum", "Figures", "Glossary")


KV_FRACTION = {"snapkv-512": 0.125, "snapkv-half": 0.5, "recent-half": 0.5}
KV_FULL = 8 * 2 ** 20  # bytes of the fake full cache


def interval(est, half=0.02):
    return {"estimate": est, "lo": est - half, "hi": est + half}


def fraction(est, half=0.02):
    return {"estimate": est, "lo": max(est - half, 0.0), "hi": min(est + half, 1.0)}


def curve(x, est, half=0.03):
    est = np.asarray(est, dtype=float)
    return {"x": list(x), "estimate": est.tolist(), "lo": np.clip(est - half, 0, 1).tolist(),
            "hi": np.clip(est + half, 0, 1).tolist()}


def typed(analysis: dict) -> StudyAnalysis:
    """The report reads typed analyses; the fakes here are written as analysis.json."""
    return StudyAnalysis.from_json(analysis)


def iv(data: dict) -> Interval:
    return Interval.from_json(data, 0.95)


def fake_action(model: str, action: str, hazard: float, rng: np.random.Generator) -> dict:
    t = np.arange(1, H + 1)
    p = np.where(t >= 2, hazard * (1 - hazard) ** (t - 2), 0.0)  # P(tau = t); tau >= 2
    cdf = np.cumsum(p)
    delta = np.clip(cdf * 0.9 + rng.normal(0, 0.01, H), 0, 1)
    delta[0] = 0.0
    timing = curve(t, cdf)
    timing["lo"][5] = float("nan")  # a band with a hole
    expected = curve(t, delta)
    expected["estimate"][-1] = float("nan")  # an unmeasured last position
    j = np.arange(1, 17)
    lag = curve(j, 0.84 + 0.07 * j / 16 + rng.normal(0, 0.005, 16))
    lag["hi"][3] = None
    strict = curve(j, 0.82 + 0.06 * j / 16)
    R = float(delta[np.isfinite(delta)].mean())
    O = float(cdf[-1] / H)  # noqa: E741
    E = float((p * (H - t)).sum() / H)
    Pi = R - O
    bounds = []
    for L in (1, 4, 16, H):
        R_L = O + (Pi * min(L, H) / H)
        B_L = max(R - R_L, 0.0) * 1.3
        bounds.append({"L": L, "R_L": R_L, "B_L": B_L, "lo": R_L, "hi": R_L + B_L,
                       "minimax": R_L + B_L / 2, "hoeffding_lo": max(0.0, R_L - 0.05),
                       "hoeffding_hi": min(1.0, R_L + B_L + 0.05)})
    return {
        "model": model, "action": action, "documents": 60,
        "kv_bytes": KV_FRACTION[action] * KV_FULL, "kv_fraction": KV_FRACTION[action],
        "scalars": {
            "p_diverge": fraction(float(cdf[-1])),
            "mean_entry_time": interval(float((p * t).sum() / cdf[-1]), 0.8),
            "R": interval(R), "O": interval(O, 0.001), "E": interval(E), "Pi": interval(Pi),
            "C": interval(Pi / E if E else 0.0), "F": interval(R * 0.3),
            "R_minus_F": interval(R * 0.7), "S99": interval(0.05, 0.01),
            "B": interval(0.07, 0.015), "B_strict": interval(0.06, 0.02),
        },
        "curves": {"timing_cdf": timing, "expected_delta": expected, "lag_profile": lag,
                   "lag_profile_strict": strict},
        "eos_split": {"categories": ["pre-EOS", "first EOS", "one absorbed", "both absorbed"],
                      "R": [R * 0.8, R * 0.05, R * 0.1, R * 0.05],
                      "F": [R * 0.25, 0.0, R * 0.05, 0.0],
                      "R_minus_F": [R * 0.55, R * 0.05, R * 0.05, R * 0.05]},
        "bounds": bounds,
    }


def fake_contrast(model, a, b, rng):
    """The contrast ``a - b`` (``a`` the later action, as the analysis names them)."""
    occ, exp_, rate = rng.normal(0.005, 0.002), rng.normal(0.15, 0.02), rng.normal(0.02, 0.01)
    dR = occ + exp_ + rate
    return {"model": model, "a": a, "b": b, "dR": interval(dR), "dO": interval(occ, 0.001),
            "dE": interval(0.16), "dC": interval(0.03), "occurrence_term": interval(occ, 0.001),
            "exposure_term": interval(exp_), "rate_term": interval(rate, 0.01),
            "exposure_share": interval(exp_ / dR, 0.04)}


def fake_eos_contrast(model, a, b):
    dG = [interval(0.01, 0.004), interval(0.002, 0.001), interval(0.03, 0.01), interval(0.0, 0)]
    return {"model": model, "a": a, "b": b, "categories": ["pre-EOS", "first EOS",
                                                           "one absorbed", "both absorbed"],
            "dG": dG, "dR_minus_F": interval(0.042), "pre_eos": dG[0],
            "eos_share": interval(0.7619, 0.05)}


def fake_strata(model, contrasts):
    return [{"model": model, "stratum": name, "documents": 30,
             "actions": [{"action": a["action"], "scalars": a["scalars"]}
                         for a in make_actions() if a["model"] == model],
             "contrasts": [{k: v for k, v in c.items() if k != "model"}
                           for c in contrasts if c["model"] == model]}
            for name in ("helmet-4k", "ruler-4k")]


def make_actions() -> list[dict]:
    rng = np.random.default_rng(7)
    hazards = {"snapkv-512": 0.12, "snapkv-half": 0.04, "recent-half": 0.10}
    return [fake_action(m, a, hazards[a] * (1.1 if i else 1.0), rng)
            for i, m in enumerate(MODELS) for a in ACTIONS]


def make_analysis() -> dict:
    actions = make_actions()
    rng = np.random.default_rng(8)
    del actions[5]["curves"]["lag_profile"], actions[5]["curves"]["lag_profile_strict"]
    actions[4]["eos_split"] = None
    actions[1]["scalars"]["F"] = interval(float("nan"))
    actions[2]["kv_bytes"] = actions[2]["kv_fraction"] = None  # cache size not recorded
    contrasts = [fake_contrast(m, a, "snapkv-half", rng)
                 for m in MODELS for a in ("snapkv-512", "recent-half")]
    endpoints = [{"model": m, "name": f"{q}({a})", "estimate": 0.05, "lo": 0.01, "hi": 0.09,
                  "alpha": 0.05 / 8}
                 for m in MODELS for q in ("B", "S99") for a in ("snapkv-90", "recent-90")]
    return {
        "meta": {"config": {"name": "test study", "strata": ["helmet-4k", "ruler-4k"]},
                 "versions": {"torch": "2.13.0", "kvpress": "0.5.5"}, "estimator": "rollout",
                 "horizon": H, "replicates": 8, "temperature": 1.0, "bootstrap": 200,
                 "alpha": 0.05, "documents": {"helmet-4k": 30, "ruler-4k": 30}},
        "lags": {"max_entry": 16, "lags": list(range(1, 17)), "early": [1, 4], "late": [13, 16]},
        "actions": actions,
        "contrasts": contrasts,
        "endpoints": endpoints,
        "certified_order": [{"model": MODELS[0], "L": H, "better": "snapkv-half",
                             "worse": "snapkv-512"}],
        "strata": [s for m in MODELS for s in fake_strata(m, contrasts)],
        "eos_contrasts": [fake_eos_contrast(m, "recent-half", "snapkv-half") for m in MODELS],
        "local_agreement": [{"model": m, "action": a, "run_length": 4, "max_entry": 16,
                             "agree_run": fraction(0.3125), "relapse": fraction(0.25)}
                            for m in MODELS for a in ACTIONS],
        "cohort_support": [{"model": m, "action": a, "max_entry": 16, "documents": 57,
                            "documents_total": 60, "trajectories": 301,
                            "trajectories_total": 480} for m in MODELS for a in ACTIONS],
        "task": [{"model": m, "action": a, "documents": 60, "acc_p": fraction(0.8),
                  "acc_q": fraction(0.7), "diff": {"estimate": -0.1, "lo": -0.13, "hi": -0.07},
                  "flips_lost": fraction(0.15), "flips_gained": fraction(0.05),
                  "se_coupled": fraction(0.015), "se_uncoupled": fraction(0.03)}
                 for m in MODELS for a in ACTIONS],
        "task_by_divergence": [{"model": m, "action": a, "x": list(range(1, H + 1)),
                                "estimate": [-0.2] * H, "lo": [-0.3] * H, "hi": [-0.1] * H,
                                "p_diverged": np.linspace(0.05, 0.6, H).tolist()}
                               for m in MODELS for a in ACTIONS],
        "teacher_forced": [{"model": m, "action": a, "documents": 60, "kl": interval(0.1 * i),
                            "top1": fraction(0.9 - 0.1 * i), "dp": interval(-0.01 * i),
                            "ppl_ratio": interval(1 + 0.05 * i), "strata": []}
                           for m in MODELS for i, a in enumerate(ACTIONS)],
        "speculative": [{"model": m, "action": a, "documents": 60,
                         "acceptance": fraction(0.9 - 0.1 * i),
                         "tokens_per_round": {str(g): interval((1 - (0.9 - 0.1 * i) ** (g + 1))
                                                               / (0.1 + 0.1 * i), 0.1)
                                              for g in (1, 2, 4, 8, 16)},
                         "first_round": {str(k): fraction((0.9 - 0.1 * i) ** k)
                                         for k in range(1, 17)}, "strata": []}
                        for m in MODELS for i, a in enumerate(ACTIONS)],
    }


def make_swrb_analysis() -> dict:
    """What an SWRB study yields: timing curves only, no contrasts, no EOS split."""
    out = make_analysis()
    out["meta"]["estimator"] = "swrb"
    out["contrasts"], out["endpoints"], out["certified_order"] = [], [], []
    out["eos_contrasts"], out["local_agreement"], out["cohort_support"] = [], [], []
    out["task"], out["task_by_divergence"] = [], []
    out["teacher_forced"], out["speculative"] = [], []
    for s in out["strata"]:
        s["contrasts"] = []
    for a in out["actions"]:
        a["curves"] = {"timing_cdf": a["curves"]["timing_cdf"]}
        a["eos_split"] = None
        a["kv_bytes"] = a["kv_fraction"] = None  # cache size not recorded
    return out


@pytest.fixture
def analysis() -> dict:
    return make_analysis()


@pytest.fixture
def swrb_analysis() -> dict:
    return make_swrb_analysis()


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """The full fake analysis's report, written once for the module (figures take ~2 s)."""
    out = tmp_path_factory.mktemp("report") / "out"
    write_report(typed(make_analysis()), out)
    return out


def test_contrasts_are_written_minuend_first(report_dir):
    """A contrast ``a - b`` (``a`` the later action) reads "a − b" under headers that say so,
    in the decomposition and EOS tables alike; never the other way round."""
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    assert html.count("contrast (a &minus; b)") >= 2 and "(b &minus; a)" not in html
    assert "R<sub>a</sub> &minus; R<sub>b</sub>" in html
    assert "recent-half &minus; snapkv-half" in html and "snapkv-512 &minus; snapkv-half" in html
    assert "snapkv-half &minus; recent-half" not in html


def strict_json(text: str):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_write_report(report_dir):
    path = report_dir / "report.html"
    assert path.exists()
    html = path.read_text(encoding="utf-8")
    for name in MODELS + ACTIONS:
        assert name in html
    for heading in TABLE_HEADINGS:
        assert f">{heading}</h" in html
    assert "&alpha;/k = 0.05/8 = 0.00625" in html  # the adjustment is stated
    assert "certainly better" in html

    pngs = sorted((report_dir / "figures").glob("*.png"))
    assert [p.stem for p in pngs] == sorted(f.name for f in FIGURES)
    assert html.count("data:image/png;base64,") == len(pngs)
    for png in pngs:
        assert png.read_bytes()[:8] == PNG_MAGIC
        image = plt.imread(png)
        assert image.ndim == 3 and min(image.shape[:2]) > 300


def test_new_tables(report_dir):
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    assert "EOS share (%)" in html and '<span class="est">76.2</span>' in html
    assert "&Delta;G<sub>0</sub> pre-EOS (pp)" in html
    assert "57 of 60" in html and "301 of 480" in html
    assert "&ge; 4 consecutive agreements (%)" in html and '<span class="est">31.2</span>' in html
    strata = html[html.index('id="strata"'):html.index('id="figures"')]
    assert "helmet-4k" in strata and "ruler-4k" in strata and "exposure share" in strata
    # fake exposure shares are ~0.9 and dR intervals are +-2 pp around ~+17 pp
    assert "Exposure share above 50% in 4 of 4 stratum contrasts" in strata
    assert "excludes 0 in 4 of 4" in strata


def test_analysis_json_is_strict(report_dir):
    analysis = make_analysis()
    data = strict_json((report_dir / "analysis.json").read_text(encoding="utf-8"))
    assert data["actions"][0]["curves"]["timing_cdf"]["lo"][5] is None
    assert data["actions"][1]["scalars"]["F"]["estimate"] is None
    assert data["actions"][0]["scalars"]["R"]["estimate"] == pytest.approx(
        analysis["actions"][0]["scalars"]["R"]["estimate"])
    assert data["meta"] == analysis["meta"]


def test_headline_formatting(report_dir):
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    p = make_analysis()["actions"][0]["scalars"]["p_diverge"]
    est, interval = interval_text(iv(p), 100).split(" ", 1)
    assert f'<span class="est">{est}</span><br><span class="ci">{interval}</span>' in html
    assert "P(&tau; &le; 32)" in html
    assert "<td class=\"num\">—</td>" in html  # the NaN F of one action


def test_cache_size_in_the_headline_the_json_and_the_risk_memory_figure(report_dir):
    analysis = make_analysis()
    data = strict_json((report_dir / "analysis.json").read_text(encoding="utf-8"))
    for got, want in zip(data["actions"], analysis["actions"], strict=True):
        assert (got["kv_bytes"], got["kv_fraction"]) == (want["kv_bytes"], want["kv_fraction"])
    assert data["actions"][2]["kv_fraction"] is None
    # the figure's points: each action with a cache size, its R interval as analysis.json has it
    want: dict[str, list] = {}
    for a in analysis["actions"]:
        if a["kv_fraction"] is not None:
            r = a["scalars"]["R"]
            want.setdefault(a["model"], []).append(
                (a["action"], a["kv_fraction"], r["estimate"], r["lo"], r["hi"]))
    got = {m: [(p.action, p.kv_fraction, p.R, p.lo, p.hi) for p in ps]
           for m, ps in risk_memory_points(typed(analysis)).items()}
    assert got == want and [len(v) for v in got.values()] == [2, 3]
    assert (report_dir / "figures" / "risk_memory.png").read_bytes()[:8] == PNG_MAGIC
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    headline = html[html.index('id="headline"'):html.index("</section>",
                                                           html.index('id="headline"'))]
    assert "<th class=\"num\">kv_fraction</th><th class=\"num\">kv_bytes (KiB)</th>" in headline
    # snapkv-512: 1/8 of 8 MiB; recent-half of the first model: not recorded
    assert ('<td>snapkv-512</td><td class="num">60</td><td class="num">0.125</td>'
            '<td class="num">1024.0</td>') in headline
    assert ('<td>recent-half</td><td class="num">60</td><td class="num">—</td>'
            '<td class="num">—</td>') in headline
    console = Console(record=True, width=250)
    console.print(summary_table(typed(analysis)))
    text = console.export_text()
    assert "kv_fraction" in text and "0.500" in text


def test_swrb_report_has_only_timing(swrb_analysis, tmp_path):
    # a previous full report's figures in the same folder must not survive
    (tmp_path / "figures").mkdir()
    for figure in FIGURES:
        (tmp_path / "figures" / f"{figure.name}.png").write_bytes(PNG_MAGIC)
    html = write_report(typed(swrb_analysis), tmp_path).read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 1
    assert [p.name for p in (tmp_path / "figures").glob("*.png")] == ["timing.png"]
    assert "kv_fraction" not in html  # no cache sizes: no column, no risk-memory figure
    assert "No contrasts in this analysis" in html
    assert "survival-weighted residual branching" in html


def test_figures_skip_missing_curves(swrb_analysis, tmp_path):
    swrb_analysis = typed(swrb_analysis)
    assert plot_contrasts(swrb_analysis, tmp_path / "c.png") is None
    assert plot_lag_profiles(swrb_analysis, tmp_path / "l.png") is None
    assert plot_expected_delta(swrb_analysis, tmp_path / "e.png") is None
    assert not (tmp_path / "l.png").exists()
    empty = StudyAnalysis(StudyMeta("rollout", H, 8, 200, 0.05))
    assert plot_timing(empty, tmp_path / "x.png") is None


def test_lag_figure_with_one_action_missing(analysis, tmp_path):
    only = copy.deepcopy(analysis)
    only["actions"] = [a for a in only["actions"] if a["model"] == MODELS[1]]
    for a in only["actions"][:2]:
        del a["curves"]["lag_profile"]
    # the third action of model 2 has no lag curve in the fixture: nothing to draw
    assert plot_lag_profiles(typed(only), tmp_path / "l.png") is None


def test_summary_table_renders(analysis):
    console = Console(record=True, width=200)
    console.print(summary_table(typed(analysis)))
    text = console.export_text()
    for name in ACTIONS + MODELS:
        assert name in text
    assert "R_TV−F" in text and "R_TV" in text and "P(τ≤32)" in text and "(pp)" in text
    r = make_analysis()["actions"][0]["scalars"]["R"]
    est, interval = interval_text(iv(r), 100, digits=1).split(" ", 1)
    assert est in text and interval in text  # intervals survive (no markup eaten)
    assert "[lo, hi]" in text


def test_json_safe():
    raw = {"a": float("nan"), "b": [np.float32(0.5), float("inf")], "c": np.arange(2),
           "d": (1, None)}
    assert to_json_safe(raw) == {"a": None, "b": [0.5, None], "c": [0, 1], "d": [1, None]}
    with pytest.raises(TypeError, match="object"):
        to_json_safe({"x": object()})


def test_interval_text():
    assert interval_text(Interval(0.1234, 0.1, 0.15, 0.95), 100) == "12.34 [10.00, 15.00]"
    assert interval_text(Interval(0.02, math.nan, 0.03, 0.95), 100, signed=True) == "+2.00"
    assert interval_text(Interval(math.nan, 0, 1, 0.95)) == "—"
    assert interval_text(None) == "—"


def test_empty_analysis(tmp_path):
    empty = StudyAnalysis(StudyMeta("rollout", H, 8, 200, 0.05))
    html = write_report(empty, tmp_path).read_text(encoding="utf-8")
    assert "data:image/png;base64," not in html
    assert "No actions in this analysis" in html
    data = strict_json((tmp_path / "analysis.json").read_text(encoding="utf-8"))
    assert data["lags"] is None and data["meta"]["horizon"] == H
    assert all(data[k] == [] for k in data if k not in ("meta", "lags"))


def test_figures_accept_arrays_and_missing_terms(tmp_path):
    analysis = make_analysis()
    timing = analysis["actions"][0]["curves"]["timing_cdf"]
    analysis["actions"][0]["curves"]["timing_cdf"] = {
        k: np.asarray(v, dtype=float) for k, v in timing.items()}
    analysis["actions"][0]["scalars"]["p_diverge"] = None  # legend falls back to the curve
    analysis["contrasts"][0]["rate_term"] = None
    analysis["lags"] = {}
    analysis = typed(analysis)
    assert plot_timing(analysis, tmp_path / "t.png").read_bytes()[:8] == PNG_MAGIC
    assert plot_contrasts(analysis, tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC
    assert plot_lag_profiles(analysis, tmp_path / "l.png").read_bytes()[:8] == PNG_MAGIC


def swrb_rate_above_one() -> dict:
    """An SWRB analysis whose C_H left [0, 1], as seen in a real run: 101.2% [73.3, 116.3]."""
    out = make_swrb_analysis()
    out["actions"][0]["scalars"]["C"] = {"estimate": 1.012, "lo": 0.733, "hi": 1.163}
    return out


def test_swrb_rate_note_in_report_and_raw_value_in_json(tmp_path):
    html = write_report(typed(swrb_rate_above_one()), tmp_path / "swrb").read_text(
        encoding="utf-8")
    assert '<span class="est">101.20</span><br><span class="ci">[73.30, 116.30]</span>' in html
    assert "ratio of two unbiased estimates" in html and "[0, 1]" in html
    data = strict_json((tmp_path / "swrb" / "analysis.json").read_text(encoding="utf-8"))
    assert data["actions"][0]["scalars"]["C"] == {"estimate": 1.012, "lo": 0.733, "hi": 1.163}
    rollout = write_report(typed(make_analysis()), tmp_path / "rollout").read_text(
        encoding="utf-8")
    assert "ratio of two unbiased estimates" not in rollout  # rollouts keep C_H in [0, 1]


def test_swrb_rate_note_under_the_summary_table():
    def render(analysis):
        console = Console(record=True, width=200)
        console.print(summary_table(typed(analysis)))
        return console.export_text()

    swrb = render(swrb_rate_above_one())
    assert "101.2" in swrb and "[73.3, 116.3]" in swrb
    assert "ratio" in swrb and "[0, 1]" in swrb and "analysis.json" in swrb
    assert "[0, 1]" not in render(make_analysis())


def test_print_whole_off_a_terminal():
    """Printed to a file at 80 columns, every name and number of a wide table stays whole."""
    analysis = make_analysis()
    for a in analysis["actions"]:
        a["model"] = "/data/models/" + a["model"]  # a long local path
    page = io.StringIO()
    print_whole(Console(file=page, width=80), summary_table(typed(analysis)))
    text = page.getvalue()
    assert "…" not in text
    for a in analysis["actions"]:
        assert a["model"] in text and f" {a['action']} " in text
        for key in ("R", "E", "C"):
            assert interval_text(iv(a["scalars"][key]), 100, digits=1).split(" ", 1)[0] in text
    terminal = Console(file=io.StringIO(), width=80, force_terminal=True, record=True)
    print_whole(terminal, summary_table(typed(analysis)))
    assert max(len(line) for line in terminal.export_text().splitlines()) == 80  # as it was


def point_only(estimate: float) -> Interval:
    """A point estimate without an interval, as ``kvdrift run``'s analysis (no bootstrap)."""
    return Interval(estimate, math.nan, math.nan, 0.95)


def run_analysis(estimator: str, actions: list[ActionResult], readings: dict | None = None
                 ) -> StudyAnalysis:
    """A point-estimate-only analysis of ``actions``; ``readings`` maps an action to its
    (KL, acceptance, tokens per round at draft length 4)."""
    meta = StudyMeta(estimator=estimator, horizon=8, replicates=2, bootstrap=0, alpha=0.05)
    forced, spec = [], []
    for action, (kl, acceptance, tokens) in (readings or {}).items():
        nan = point_only(math.nan)
        forced.append(TeacherForcedResult("m", action, TeacherForcedNumbers(
            point_only(kl), nan, nan, nan), 3))
        spec.append(SpeculativeResult("m", action, SpeculativeNumbers(
            point_only(acceptance), {g: point_only(tokens if g == 4 else 1.0 + g / 100)
                                     for g in (1, 2, 4, 8)}, {}), 3))
    return StudyAnalysis(meta, actions=tuple(actions), teacher_forced=tuple(forced),
                         speculative=tuple(spec))


def run_action(action: str, **estimates: float) -> ActionResult:
    return ActionResult("m", action, 3, {k: point_only(v) for k, v in estimates.items()})


def test_run_table_marks_unmeasured_quantities():
    nan = float("nan")
    rows = [run_action("snapkv-half", p_diverge=0.5, mean_entry_time=4.5, R=0.1, O=0.02,
                       E=0.4, Pi=0.08, C=1.012, F=nan, R_minus_F=nan, R_tv=nan),
            run_action("full", p_diverge=0.0, mean_entry_time=nan, R=0.0, O=0.0, E=0.0,
                       Pi=0.0, C=0.0, F=nan, R_minus_F=nan, R_tv=nan)]
    console = Console(record=True, width=200)
    console.print(run_table(run_analysis("swrb", rows)))
    text = console.export_text()
    assert "nan" not in text

    def cells(action):
        line = next(line for line in text.splitlines() if f" {action} " in line)
        return [c.strip() for c in line.split("│")[1:-1]]

    # F and the readings along X (KL, acceptance, tokens per round) of SWRB are not measured;
    # there is no entry time without divergence
    # SWRB has no rollout-TV risk either (it follows no complete branch pair)
    assert cells("snapkv-half") == ["m", "snapkv-half", "3", "50.0%", "4.5", "10.00%", "—",
                                    "2.00%", "40.00%", "8.00%", "101.2%", "—", "—", "—", "—",
                                    "—"]
    assert cells("full")[4:] == ["—", "0.00%", "—", "0.00%", "0.00%", "0.00%", "0.0%", "—",
                                 "—", "—", "—", "—"]  # no kv_fraction in these records
    assert "ratio" in text and "[0, 1]" in text
    console = Console(record=True, width=200)
    console.print(run_table(run_analysis("rollout", rows[:1])))
    assert "[0, 1]" not in console.export_text()


def test_run_rows_and_table_read_each_actions_own_entries():
    """The run's JSON rows and table take each action's scalars, readings and cache size from
    its own entries of the analysis (not a neighbour's), in the analysis' order."""
    actions = [replace(run_action(name, p_diverge=p, mean_entry_time=2.0, R=r, O=r / 4,
                                  E=2 * r, Pi=3 * r / 4, C=3 / 8, F=r / 2, R_minus_F=r / 2,
                                  R_tv=r, S99=0.9), kv_bytes=kv, kv_fraction=kv / 1000)
               for name, p, r, kv in (("kivi", 0.1, 0.04, 250.0), ("recent", 0.3, 0.2, 500.0))]
    readings = {"recent": (0.17, 0.89, 3.12), "kivi": (0.0048, 0.977, 3.79)}
    analysis = run_analysis("rollout", actions, readings)
    rows = run_rows(analysis)
    assert [list(r) for r in rows] == [[
        "model", "action", "documents", "p_diverge", "mean_entry_time", "R", "O", "E", "Pi",
        "C", "F", "R_minus_F", "R_tv", "kl", "acceptance", "tokens_per_round", "kv_bytes",
        "kv_fraction", "kv_fraction_generation"]] * 2
    recent = rows[1]
    assert (recent["action"], recent["R"], recent["p_diverge"], recent["F"]) == (
        "recent", 0.2, 0.3, 0.1)
    assert (recent["kl"], recent["acceptance"], recent["tokens_per_round"]) == (0.17, 0.89, 3.12)
    assert (recent["kv_bytes"], recent["kv_fraction"]) == (500.0, 0.5)
    assert math.isnan(recent["kv_fraction_generation"])  # not in this analysis
    assert run_rows(replace(analysis, actions=(replace(actions[0], kv_fraction_generation=0.3),
                                               actions[1])))[0]["kv_fraction_generation"] == 0.3
    assert rows[0]["kl"] == 0.0048 and rows[0]["R_tv"] == 0.04
    console = Console(record=True, width=250)
    console.print(run_table(analysis))
    line = next(x for x in console.export_text().splitlines() if " recent " in x)
    assert [c.strip() for c in line.split("│")[1:-1]] == [
        "m", "recent", "3", "30.0%", "2.0", "20.00%", "20.00%", "5.00%", "40.00%", "15.00%",
        "37.5%", "10.00%", "0.170", "89.0%", "3.12", "0.500"]
    # without the teacher-forced entries (older records) only KL is unmeasured
    no_kl = run_rows(replace(analysis, teacher_forced=()))
    assert math.isnan(no_kl[1]["kl"]) and no_kl[1]["acceptance"] == 0.89


def test_endpoints_are_shown_in_their_quantitys_unit(tmp_path):
    """An endpoint's unit comes from the registry: a mean entry time is in steps (not a
    percentage of 100x its value), a difference of percentages in signed pp, B in pp."""
    analysis = make_analysis()
    analysis["endpoints"] = [
        {"model": MODELS[0], "name": name, "estimate": est, "lo": lo, "hi": hi, "alpha": 0.0125}
        for name, est, lo, hi in (("mean_entry_time(snapkv-90)", 3.5, 3.0, 4.0),
                                  ("R(recent-90) - R(snapkv-90)", 0.05, 0.01, 0.09),
                                  ("B(snapkv-90)", 0.02, 0.0, 0.04),
                                  ("S99(recent-90)", 0.25, 0.2, 0.3))]
    html = write_report(typed(analysis), tmp_path).read_text(encoding="utf-8")
    table = html[html.index('id="endpoints"'):html.index('id="bounds"')]
    assert '<span class="est">3.50 steps</span><br><span class="ci">[3.00, 4.00]</span>' in table
    assert '<span class="est">+5.00 pp</span><br><span class="ci">[+1.00, +9.00]</span>' in table
    assert '<span class="est">+2.00 pp</span>' in table
    assert '<span class="est">25.00 %</span><br><span class="ci">[20.00, 30.00]</span>' in table


def test_memory_over_the_generation_is_shown_where_an_action_decodes():
    """An action compressed during generation puts "kv_fraction over H" beside the prompt
    cache's in the summary and the headline; an analysis without one shows neither."""
    from kvdrift.report.sections.headline import headline

    plain = [replace(run_action("snapkv", R=0.1), kv_bytes=500.0, kv_fraction=0.5,
                     kv_fraction_generation=0.62)]
    decoding = [*plain, replace(run_action("decoding-knorm:interval=64,target=256", R=0.2),
                                kv_bytes=1000.0, kv_fraction=1.0, kv_fraction_generation=0.31,
                                compressions=(66, 130))]
    for actions, shown in ((plain, False), (decoding, True)):
        console = Console(record=True, width=250)
        console.print(summary_table(run_analysis("rollout", actions)))
        text = console.export_text()
        assert ("over H" in text) == shown
        page = str(headline(run_analysis("rollout", actions)))
        assert ("kv_fraction over H" in page) == shown
    line = next(x for x in text.splitlines() if "decoding-knorm" in x)
    assert [c.strip() for c in line.split("│")[3:5]] == ["1.000", "0.310"]
