"""A frontier family over a decoding-time press's target (frontier_search/families.py), and the
memory measure a frontier reads (Q's cache over the generation when a family decodes)."""

from __future__ import annotations

import pytest

from kvdrift.frontier_search.families import (
    DECODING_TARGETS,
    memory_column,
    parse_family,
)
from kvdrift.lm.actions.spec import parse_action


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


@pytest.mark.parametrize(("text", "words"), [
    ("decoding-knorm:target=64", "names its press without target="),
    ("decoding-knorm:interval=8, target=64", "names its press without target="),
    ("decoding-knorm+kivi:bits=4", "takes no '\\+'"),
    ("decoding-nosuch", "decoding-nosuch"),
])
def test_bad_decoding_families_are_refused(text, words):
    with pytest.raises(ValueError, match=words):
        parse_family(text)


def test_a_frontier_with_a_decoding_family_measures_memory_over_the_generation():
    snap, kivi, dec = (parse_family(n) for n in ("snapkv", "kivi", "decoding-knorm"))
    assert memory_column([snap, kivi]) == "kv_fraction"
    assert memory_column([snap, dec]) == memory_column([dec]) == "kv_fraction_generation"


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


def test_a_family_list_keeps_a_decoding_familys_fields_together():
    from kvdrift.frontier_search.families import split_families

    assert split_families("snapkv, decoding-snapkv:interval=64,window_size=4,kivi") == (
        "snapkv", "decoding-snapkv:interval=64,window_size=4", "kivi")
    assert split_families("snapkv+kivi:bits=4,,recent") == ("snapkv+kivi:bits=4", "recent")


def test_the_frontier_command_refuses_a_decoding_family_with_a_target_before_loading(tmp_path):
    from typer.testing import CliRunner

    from kvdrift.cli import app

    result = CliRunner().invoke(app, ["frontier", "--families",
                                      "snapkv,decoding-knorm:interval=8,target=64",
                                      "--out", str(tmp_path / "fr")])
    assert result.exit_code == 2 and "names its press without target=" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "fr").exists()
