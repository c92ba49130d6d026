"""A frontier family over a decoding-time press's target (frontier_search/families.py): a
``DecodingPress`` (``decoding-<scorer>``) or a ``CAMPress`` (``cam-<scorer>``), and the memory
measure a frontier reads (Q's cache over the generation when a family decodes)."""

from __future__ import annotations

import pytest

from kvdrift.frontier_search.families import (
    DECODING_TARGETS,
    family_budgets,
    is_decoding,
    memory_column,
    parse_family,
)
from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.decoding_cam import SWRB_REFUSAL
from kvdrift.lm.factory import DriverSide, check_actions_fit

SIDE = DriverSide(name="m", tokenizer=None, build=lambda: None, context_window=None, layers=2)


def test_a_decoding_family_walks_the_target_from_the_most_entries():
    fam = parse_family("decoding-knorm")
    assert [b.label for b in fam.budgets] == [str(t) for t in DECODING_TARGETS]
    assert [b.index for b in fam.budgets] == list(range(len(DECODING_TARGETS)))
    assert fam.budgets[0].action == "decoding-knorm:target=4096"
    assert list(DECODING_TARGETS) == sorted(DECODING_TARGETS, reverse=True)
    kept = parse_family("decoding-snapkv:interval=128,window_size=4")
    assert kept.budgets[-1].action == "decoding-snapkv:interval=128,window_size=4,target=32"
    for b in kept.budgets:  # every budget is an action kvdrift runs, its fields kept
        action = parse_action(b.action)
        assert dict(action.decoding.kwargs)["target"] == int(b.label)


def test_a_cam_family_walks_the_target_its_other_fields_kept():
    fam = parse_family("cam-knorm:interval=64,merge=8")
    assert is_decoding(fam) and is_decoding(parse_family("CAM-knorm"))
    assert [b.label for b in fam.budgets] == [str(t) for t in DECODING_TARGETS]
    assert [b.action for b in fam.budgets[:2]] == ["cam-knorm:interval=64,merge=8,target=4096",
                                                    "cam-knorm:interval=64,merge=8,target=2048"]
    assert parse_family("cam-knorm").budgets[-1].action == "cam-knorm:target=32"
    for b in fam.budgets:  # each budget is kvpress's CAMPress, its fields kept
        press = parse_action(b.action).make_press(100)
        assert (type(press).__name__, press.target_size, press.compression_interval,
                press.merge_budget) == ("CAMPress", int(b.label), 64, 8)
    assert family_budgets("cam-knorm:interval=64,merge=8") == fam  # the early check agrees


@pytest.mark.parametrize(("text", "words"), [
    ("decoding-knorm:target=64", "names its press without target="),
    ("decoding-knorm:interval=8, target=64", "names its press without target="),
    ("decoding-knorm+kivi:bits=4", "takes no '\\+'"),
    ("decoding-nosuch", "decoding-nosuch"),
    ("cam-knorm:interval=8,target=64", "names its press without target="),
    ("cam-knorm+kivi:bits=4", "takes no '\\+'"),
    ("cam-nosuch", r"^family 'cam-nosuch': press must be one of .*; got 'nosuch'$"),
    ("cam-knorm:merge=0", r"^family 'cam-knorm:merge=0': .*merge must be an integer >= 1; "
                          r"got 0$"),
    ("cam-knorm:interval=8,bogus=1", r"field must be one of interval, target, buffer, merge; "
                                     r"got 'bogus'$"),
    ("cam-knorm:interval=8,ratio=0.5", r"CAMPress takes target= .* not ratio=$"),
    ("decoding-adakv-snapkv", r"^a decoding press over AdaKV hides entries but removes none .* "
                              r"got 'decoding-adakv-snapkv'$"),
    ("decoding-adakv-knorm:interval=64", r"no frontier can rank it"),
])
def test_bad_decoding_families_are_refused(text, words):
    with pytest.raises(ValueError, match=words):
        parse_family(text)


def test_a_frontier_with_a_decoding_family_measures_memory_over_the_generation():
    snap, kivi, dec = (parse_family(n) for n in ("snapkv", "kivi", "decoding-knorm"))
    assert memory_column([snap, kivi]) == "kv_fraction"
    assert memory_column([snap, dec]) == memory_column([dec]) == "kv_fraction_generation"
    assert memory_column([snap, parse_family("cam-knorm")]) == "kv_fraction_generation"


def test_a_cam_familys_budgets_are_checked_at_start_as_its_actions_are():
    """Every budget of a cam family is refused under SWRB (a CAM row cannot go back) and runs
    under the rollouts the frontier uses; a press rule that cannot hold refuses every budget
    in the spec's fields (the rules do not depend on the target)."""
    fam = parse_family("cam-knorm:interval=8,merge=2")
    for b in fam.budgets:
        with pytest.raises(ValueError) as info:
            check_actions_fit([b.action], SIDE, horizon=32, estimator="swrb")
        assert str(info.value) == f"action {b.action!r}: {SWRB_REFUSAL}"
        check_actions_fit([b.action], SIDE, horizon=32, estimator="rollout")
    for b in parse_family("cam-snapkv:interval=4").budgets:
        with pytest.raises(ValueError, match=rf"^action '{b.action}': its CAMPress compresses "
                                             r"every 4 generated tokens .*raise interval= to at "
                                             r"least 65"):
            check_actions_fit([b.action], SIDE, horizon=32)
    with pytest.raises(ValueError, match="compresses first after interval=64 generated tokens, "
                                         "beyond the horizon H = 32"):
        check_actions_fit([parse_family("cam-knorm:interval=64").budgets[0].action], SIDE,
                          horizon=32)


def test_the_frontier_runs_rollouts_only():
    import kvdrift

    with pytest.raises(ValueError, match="frontier takes no actions or estimator"):
        kvdrift.frontier(["cam-knorm"], "R <= 1", "unused", estimator="swrb")


def test_a_decoding_frontier_places_every_budget_by_its_cache_over_the_generation(
        tiny_model_dir, tmp_path):
    """End to end on the tiny model: each tried budget's memory is its records' mean
    kv_fraction_generation, for the decoding family and the prefill family alike."""
    import pandas as pd

    import kvdrift
    from kvdrift.data import Document, write_jsonl

    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(f"d{i}", " ".join(f"word{(i * 7 + j) % 50}" for j in range(40)))
                 for i in range(2)], docs)
    result = kvdrift.frontier(["decoding-knorm:interval=2", "recent"], "R <= 1", tmp_path / "fr",
                              replicates=2, max_replicates=4, model=str(tiny_model_dir),
                              docs=docs, horizon=5, device="cpu")
    records = pd.concat(pd.read_parquet(p) for p in (tmp_path / "fr").rglob("replicates/*.parquet"))
    frame = result.to_frame()
    assert len(frame) >= 2
    for row in frame.itertuples():
        reps = records[records["action"] == row.action]
        assert row.kv_fraction == pytest.approx(reps["kv_fraction_generation"].mean())
    last = frame[frame["family"] == "decoding-knorm:interval=2"].iloc[-1]
    assert last["budget"] == "32" and last["kv_fraction"] < 0.9  # the tiny prompt is cut
    assert (frame[frame["family"] == "recent"]["kv_fraction"] > 0).all()


def test_a_cam_frontier_places_every_budget_by_its_cache_over_the_generation(
        tiny_model_dir, tmp_path):
    """End to end on the tiny model, as the decoding family's test: a cam family's budgets run
    (rollouts: every budget's records come back), each placed by its records' mean
    kv_fraction_generation; the least target cuts the cache, the most leaves it whole."""
    import pandas as pd

    import kvdrift
    from kvdrift.data import Document, write_jsonl

    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(f"d{i}", " ".join(f"word{(i * 7 + j) % 50}" for j in range(40)))
                 for i in range(2)], docs)
    family = "cam-knorm:interval=2,merge=2"
    result = kvdrift.frontier([family], "R <= 1", tmp_path / "fr", replicates=2,
                              max_replicates=4, model=str(tiny_model_dir), docs=docs, horizon=5,
                              device="cpu")
    records = pd.concat(pd.read_parquet(p) for p in (tmp_path / "fr").rglob("replicates/*.parquet"))
    frame = result.to_frame()
    assert list(frame["budget"]) == [str(t) for t in DECODING_TARGETS]  # all certified
    assert (frame["family"] == family).all()
    for row in frame.itertuples():
        reps = records[records["action"] == row.action]
        assert len(reps) > 0 and row.kv_fraction == pytest.approx(
            reps["kv_fraction_generation"].mean())
    assert list(frame["kv_fraction"]) == sorted(frame["kv_fraction"], reverse=True)
    assert frame.iloc[0]["kv_fraction"] == 1.0  # 4096 entries: never compressed
    assert frame.iloc[-1]["kv_fraction"] < 0.9  # 32 entries: the tiny prompt is cut
    assert result.best is not None and result.best.label == "32"  # least memory certified
    assert (frame["status"] == "certified").all()


def test_a_family_list_keeps_a_decoding_familys_fields_together():
    from kvdrift.frontier_search.families import split_families

    assert split_families("snapkv, decoding-snapkv:interval=64,window_size=4,kivi") == (
        "snapkv", "decoding-snapkv:interval=64,window_size=4", "kivi")
    assert split_families("snapkv+kivi:bits=4,,recent") == ("snapkv+kivi:bits=4", "recent")
    assert split_families("cam-snapkv:interval=64,window_size=4,merge=8,recent") == (
        "cam-snapkv:interval=64,window_size=4,merge=8", "recent")


@pytest.mark.parametrize(("family", "says"), [
    ("decoding-knorm:interval=8,target=64", "names its press without target="),
    ("cam-knorm:interval=8,target=64", "names its press without target="),
    ("cam-nosuch:interval=8", "got 'nosuch'"),
    ("decoding-adakv-knorm:interval=8", "removes none"),
])
def test_the_frontier_command_refuses_a_bad_decoding_family_before_loading(tmp_path, family,
                                                                            says):
    from typer.testing import CliRunner

    from kvdrift.cli import app

    result = CliRunner().invoke(app, ["frontier", "--families", f"snapkv,{family}",
                                      "--out", str(tmp_path / "fr")])
    assert result.exit_code == 2 and says in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (tmp_path / "fr").exists()
