"""Issue 46: every user-set number that decides work or memory has a stated bound checked
before anything is written, duplicate endpoints are refused, and every message names the
user's own flag, file or folder (what it is, where it is not what was asked for)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvdrift import limits
from kvdrift.analysis.plan import plan_study
from kvdrift.analysis.study import AnalysisOptions
from kvdrift.cli import app
from kvdrift.frontier_search.search import SearchSettings
from kvdrift.lm.grammar.fields import ActionError, check_field
from kvdrift.run.runner import RunConfig
from kvdrift.study_config import load_study
from tests.messages import whole

runner = CliRunner()
HUGE = 100000000000000000001


def one_error(args, cwd=None) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0].removeprefix("error: ")


# --- bounds ----------------------------------------------------------------------------------


def test_search_replicates_are_bounded_and_named():
    with pytest.raises(ValueError, match=whole(
            "max_replicates must be at most 4_096 (kvdrift's limit); got 100_000_000_000")):
        SearchSettings(max_replicates=10**11)
    with pytest.raises(ValueError, match=whole(
            "replicates must be at most 4_096 (kvdrift's limit); got 100_000_000_000")):
        SearchSettings(replicates=10**11)  # named itself, not max_replicates
    with pytest.raises(ValueError, match=whole(
            "max_replicates must be at least replicates (16); got 8")):
        SearchSettings(replicates=16, max_replicates=8)


def test_frontier_flags_are_named(tmp_path):
    assert one_error(["frontier", "--replicates", str(10**11), "--out", str(tmp_path / "f")]) \
        == "--replicates must be at most 4_096 (kvdrift's limit); got 100_000_000_000"
    assert one_error(["frontier", "--replicates", "16", "--max-replicates", "8", "--out",
                      str(tmp_path / "f")]) == \
        "--max-replicates must be at least --replicates (16); got 8"
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("flags, message", [
    (["--horizon", "-1"], "--horizon must be an integer >= 1; got -1"),
    (["--replicates", "0"], "--replicates must be an integer >= 1; got 0"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0 (0 = greedy); got -1.0"),
    (["--seed", str(10**20)], f"--seed must be an integer within 0..{2**63 - 1}; got {10**20}"),
    (["--replicates", "100000", "--horizon", "100000"],
     "--horizon must be at most 65_536 (kvdrift's limit); got 100_000"),
])
def test_run_flags_are_named(tmp_path, flags, message):
    assert one_error(["run", *flags, "--out", str(tmp_path / "r")]) == message
    assert not (tmp_path / "r").exists()


def test_press_fields_are_bounded_by_what_kvpress_takes():
    with pytest.raises(ActionError, match=whole(
            "SnapKVPress: kernel_size must be at most 2_147_483_647 in size (kvdrift's limit: "
            "what kvpress's C integers hold); got 100_000_000_000_000_000_001")):
        check_field("SnapKVPress", "kernel_size", HUGE)
    with pytest.raises(ActionError, match="n_future_positions must be at most 2_147_483_647"):
        check_field("SnapKVPress", "n_future_positions", 2**31)
    with pytest.raises(ActionError, match=whole("KnormPress: scale must be a finite number; "
                                                "got inf")):
        check_field("KnormPress", "scale", float("inf"))
    check_field("SnapKVPress", "kernel_size", 2**31 - 1)  # odd, within a C int


def test_a_huge_press_field_is_refused_before_run_json(tmp_path):
    out = tmp_path / "run"
    message = one_error(["run", "--actions", f"snapkv:ratio=0.5,kernel_size={HUGE}",
                         "--out", str(out)])
    assert message.startswith(f"action 'snapkv:ratio=0.5,kernel_size={HUGE}': SnapKVPress: "
                              "kernel_size must be at most 2_147_483_647")
    assert not out.exists()


def test_seeds_are_bounded_where_they_are_set(tmp_path):
    with pytest.raises(ValueError, match=whole(
            f"seed must be an integer within 0..{2**63 - 1}; got {2**63}")):
        RunConfig(seed=2**63)
    with pytest.raises(ValueError, match="seed must be an integer within 0.."):
        AnalysisOptions(seed=-1)
    assert one_error(["finite-state", "--seed", str(10**29), "--figure",
                      str(tmp_path / "f.png")]) == (
        f"--seed must be an integer within 0..{limits.MAX_FINITE_SEED}; got {10**29}")
    assert not (tmp_path / "f.png").exists()


def test_duplicate_endpoints_are_refused_however_written():
    with pytest.raises(ValueError, match=whole(
            "endpoints must each be given once (each one divides alpha); got 'R(b) - R(a)' "
            "and 'b - a'")):
        AnalysisOptions(endpoints=("b - a", "R(a)", "R(b) - R(a)"))
    with pytest.raises(ValueError, match="given once"):
        AnalysisOptions(endpoints=("S99(a)",) * 3000)
    AnalysisOptions(endpoints=("R(b) - R(a)", "R(a) - R(b)", "B(a)"))  # distinct


def test_plan_endpoints_and_levels_are_named(tmp_path):
    reps = pd.DataFrame({"model": ["m"], "action": ["a"]})
    with pytest.raises(ValueError, match=whole(
            "endpoints must be at most 1_000_000 (kvdrift's limit); got "
            "100_000_000_000_000_000_000_000_000")):
        plan_study(reps, "R(a)", 0.01, endpoints=10**26)
    with pytest.raises(ValueError, match=r"^alpha / \(2 x endpoints\) must be at least"):
        plan_study(reps, "R(a)", 0.01, alpha=1e-300, endpoints=1)
    assert one_error(["plan", str(tmp_path), "--target", "R(a)", "--halfwidth", "0.01",
                      "--endpoints", str(10**26)]).startswith("--endpoints must be at most")


# --- messages --------------------------------------------------------------------------------

STUDY = '[study]\nmodels = ["smollm2"]\nactions = ["snapkv-half"]\n\n[[documents]]\n' \
        'source = "ruler"\nlengths = [512]\nper_stratum = 1\n'


def test_a_toml_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + STUDY.encode())
    assert load_study(path).run.actions == ("snapkv-half",)


def test_a_toml_path_holding_nul_is_named():
    with pytest.raises(ValueError, match=whole(
            "study config path 'a\\x00b.toml' holds a NUL character; name a TOML file")):
        load_study("a\0b.toml")


def test_show_and_report_say_what_a_folder_is(tmp_path):
    missing = tmp_path / "missing"
    assert one_error(["show", str(missing)]) == \
        f"{missing} does not exist; name a run or study directory"
    (tmp_path / "plain").mkdir()
    assert one_error(["show", str(tmp_path / "plain")]) == \
        f"{tmp_path / 'plain'} is not a kvdrift run or study directory (it has no run.json)"
    frontier = tmp_path / "frontier"
    frontier.mkdir()
    (frontier / "frontier.json").write_text(json.dumps({}))
    for command in ("show", "report"):
        assert one_error([command, str(frontier)]).startswith(
            f"{frontier} is a frontier directory, not a run or study: its report is "
            f"{frontier / 'report'}")
