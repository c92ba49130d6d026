"""Actions: parsing, budget rules, exact kvpress rounding, every press family, clear errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import kvpress
import pytest
from kvpress.utils import compute_n_kept
from typer.testing import CliRunner

from kvdrift.cli import app
from kvdrift.lm.actions.presses import (
    FAMILIES,
    GENERAL_PATH,
    NOT_OFFERED,
    PLAIN,
    SCORERS,
    Stage,
    family_table,
    mid_ratio,
)
from kvdrift.lm.actions.spec import (
    NAMED_ACTIONS,
    Action,
    ActionError,
    actions_help,
    parse_action,
    split_actions,
)
from tests.messages import whole

EXPECTED_KEPT = {
    "full": lambda n: n,
    "snapkv-half": lambda n: max(1, n // 2),
    "snapkv-90": lambda n: max(1, 9 * n // 10),
    "snapkv-512": lambda n: min(512, n),
    "recent-half": lambda n: max(1, n // 2),
    "recent-90": lambda n: max(1, 9 * n // 10),
}


def test_named_actions_are_the_documented_ones():
    assert set(NAMED_ACTIONS) == set(EXPECTED_KEPT)
    assert parse_action("snapkv-half").stages[0].scorer_name == "SnapKVPress"
    assert parse_action("recent-90").stages[0].scorer_name == "StreamingLLMPress"
    assert parse_action("full").stages == () and parse_action("full").decoding is None


@pytest.mark.parametrize("name", sorted(EXPECTED_KEPT))
def test_named_kept_counts(name):
    action = parse_action(name)
    for n in [1, 2, 3, 9, 10, 11, 63, 64, 65, 99, 100, 511, 512, 513, 1000, 4096, 32768]:
        assert action.kept(n) == EXPECTED_KEPT[name](n), (name, n)
        assert 1 <= action.kept(n) <= n


@pytest.mark.parametrize("spec", [*sorted(EXPECTED_KEPT), "snapkv:budget=1", "knorm:budget=7",
                                  "tova:ratio=0.3", "streaming_llm:ratio=0.25", "snapkv:ratio=1"])
def test_compression_ratio_lands_on_exact_count_under_kvpress_rounding(spec):
    action = parse_action(spec)
    for n in range(1, 2049):
        kept = action.kept(n)
        if action.is_noop(n):
            assert action.make_press(n) is None
            continue
        ratio = action.make_press(n).compression_ratio
        assert 0.0 <= ratio < 1.0
        assert compute_n_kept(n, ratio) == kept, (spec, n)
        # StreamingLLMPress prunes n - int(n * (1 - ratio)) entries: the same rounding
        assert n - int(n * (1 - ratio)) == n - kept


def test_general_form():
    a = parse_action("knorm:ratio=0.5").stages[0]
    assert (a.scorer_name, a.ratio, a.budget) == ("KnormPress", 0.5, None)
    b = parse_action("snapkv:budget=256")
    assert (b.stages[0].scorer_name, b.stages[0].ratio, b.stages[0].budget) == ("SnapKVPress", None,
                                                                           256)
    assert (b.kept(1000), b.kept(100)) == (256, 100)
    c = parse_action("streaming_llm:ratio=0.25")
    assert c.stages[0].scorer_name == "StreamingLLMPress" and c.kept(100) == 25
    assert parse_action("recent:ratio=0.25").stages[0].scorer_name == "StreamingLLMPress"
    assert parse_action("SnapKVPress:budget=3").stages[0].scorer_name == "SnapKVPress"
    d = parse_action("snapkv:budget=8,window_size=16,kernel_size=3")
    assert d.stages[0].kwargs == (("kernel_size", 3), ("window_size", 16))
    press = d.make_press(100)
    assert (press.window_size, press.kernel_size) == (16, 3)
    assert parse_action(d.name) == d
    assert str(d) == d.name


def test_every_scorer_parses():
    for short in SCORERS:
        assert parse_action(f"{short}:ratio=0.5").kept(10) == 5


def test_budget_at_least_prompt_is_noop():
    action = parse_action("snapkv-512")
    assert action.is_noop(512) and action.is_noop(100) and not action.is_noop(513)
    assert action.make_press(300) is None


def test_short_prompt_fields_are_clamped():
    press = parse_action("snapkv-half").make_press(40)
    assert press.window_size == 39  # kvpress asserts q_len > window_size
    assert parse_action("snapkv-half").make_press(1000).window_size == 64
    assert parse_action("recent-half").make_press(3).n_sink == 2
    assert parse_action("recent-half").make_press(100).n_sink == 4


def test_kept_is_never_empty():
    for spec in ["snapkv:ratio=0.01", "knorm:budget=1", "snapkv-half"]:
        assert parse_action(spec).kept(1) == 1
        assert parse_action(spec).kept(2) == 1


def test_action_is_frozen_and_validated():
    action = parse_action("snapkv-half")
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.name = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.stages[0].ratio = 0.3  # type: ignore[misc]
    with pytest.raises(ValueError, match="exactly one"):
        Stage(family=PLAIN, scorer=kvpress.SnapKVPress, ratio=0.5, budget=3)
    decoding = parse_action("decoding-knorm:interval=4,target=8").decoding
    with pytest.raises(ValueError, match="must come last"):
        Action(name="x", stages=(decoding,))


def test_unknown_name_lists_named_actions():
    with pytest.raises(ValueError, match=r"^action must be one of full, snapkv-half, .*, or "
                       r"\[<family>-\]<scorer>:ratio=R .* and family one of adakv, .* \(see "
                       r"`kvdrift run --actions help`\); got 'snapkv-quarter'$") as info:
        parse_action("snapkv-quarter")
    message = str(info.value)
    for name in NAMED_ACTIONS:
        assert name in message
    assert "snapkv-quarter" in message


@pytest.mark.parametrize("spec,match", [
    ("snapkv:ratio=0", r"ratio .* \(0, 1\]"),
    ("snapkv:ratio=1.5", r"ratio .* \(0, 1\]"),
    ("knorm:ratio=-0.2", r"ratio .* \(0, 1\]"),
    ("snapkv:budget=0", r"budget .* >= 1"),
    ("snapkv:budget=-3", r"budget .* >= 1"),
    ("snapkv:budget=2.5", r"budget .* integer"),
    ("snapkv:ratio=abc", r"ratio must be a number"),
    ("snapkv:window=32,ratio=0.5", whole(
        "action 'snapkv:window=32,ratio=0.5': SnapKVPress field must be one of ratio, budget, "
        "window_size, kernel_size; got 'window'")),
    ("knorm:ratio=0.5,n_sink=2", whole(
        "action 'knorm:ratio=0.5,n_sink=2': KnormPress field must be one of ratio, budget; "
        "got 'n_sink'")),
    ("decoding-knorm:target=4,ratio_x=1", whole(
        "action 'decoding-knorm:target=4,ratio_x=1': decoding-KnormPress field must be one of "
        "interval, target, buffer; got 'ratio_x'")),
    ("adakv-knorm:ratio=0.5,alpha_safeguard=x", r"alpha_safeguard.*number"),
    ("chunk-knorm:budget=10", r"give exactly one of ratio="),
    ("chunkkv-knorm:ratio=0.5,chunk_length=0", r"chunk_length must be an integer >= 1"),
    ("perlayer-knorm:ratio=0.5", r"ratios="),
    ("perlayer-knorm:ratios=0.5/x", r"ratios must be numbers"),
    ("perlayer-knorm:ratios=0.5/1.5",
     r"ratios\[1\] \(fraction kept in layer 1\) must be a number within \(0, 1\]; got 1.5$"),
    ("decoding-knorm:interval=4", r"give target=T"),
    ("decoding-knorm:ratio=0.5,target=4", r"not ratio="),
    ("decoding-knorm:interval=0,target=4", r"interval must be an integer >= 1"),
    # a ratio kept so small that 1 - ratio rounds to 1: kvpress's assert, now one line
    ("decoding-knorm:interval=4,ratio=1e-17", r"1 - ratio, stays below 1 in float64 .*got "
     r"1e-17$"),
    ("decoding-adakv-knorm:interval=4,ratio=1e-17", r"stays below 1 in float64"),
    ("decoding-knorm:target=4,buffer=-1", r"buffer .* >= 0"),
    ("decoding-observed_attention:target=4", r"attention weights"),
    ("decoding-knorm:target=4+snapkv:ratio=0.5", r"must come last"),
    ("adakv-knorm:ratio=0.5+knorm:ratio=0.5", r"cannot be chained"),
    ("pyramidkv:ratio=0.5+knorm:ratio=0.5", r"cannot be chained"),
    ("adakv-knorm:ratio=0.5+decoding-knorm:target=4", r"head-adaptive"),
    ("AdaKVPress:ratio=0.5", r"adakv-<scorer>"),
    ("nosuchfamily-knorm:ratio=0.5", r"^press must be one of cap, cur, .*, tova \(or a kvpress "
     r"class name: CURPress, .*\), or <family>-<scorer> with family one of adakv, .*, "
     r"decoding, decoding-adakv, cam; got 'nosuchfamily-knorm'$"),
    ("help", r"--actions help"),
    ("nosuchpress:ratio=0.5", r"^press must be one of cap, .* snapkv, .*; "
     r"got 'nosuchpress'$"),
    ("snapkv:", r"exactly one"),
    ("snapkv:ratio=0.5,budget=3", r"exactly one"),
    ("snapkv:ratio", r"key=value"),
    ("snapkv:compression_ratio=0.5", r"not compression_ratio"),
    ("", r"empty action"),
])
def test_bad_specs_raise_clear_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_action(spec)


def test_kept_rejects_bad_prompt_length():
    with pytest.raises(ValueError, match="prompt length"):
        parse_action("snapkv-half").kept(0)


FAMILY_SPECS = {
    "adakv-snapkv:ratio=0.5": "AdaKVPress",
    "criticaladakv-snapkv:ratio=0.5": "CriticalAdaKVPress",
    "criticalkv-knorm:ratio=0.5": "CriticalKVPress",
    "block-knorm:budget=10,block_size=4": "BlockPress",
    "rerotate-knorm:ratio=0.5": "KeyRerotationPress",
    "chunk-knorm:ratio=0.5,chunk_length=16": "ChunkPress",
    "chunkkv-snapkv:ratio=0.5,chunk_length=8": "ChunkKVPress",
    "pyramidkv:ratio=0.5": "PyramidKVPress",
    "perlayer-knorm:ratios=0.9/0.5": "PerLayerCompressionPress",
    "decoding-knorm:interval=4,target=8": "DecodingPress",
    "snapkv:ratio=0.8+knorm:ratio=0.5": "ComposedPress",
    "snapkv:ratio=0.5+decoding-knorm:interval=4,target=8": "PrefillDecodingPress",
}


@pytest.mark.parametrize("spec,press", sorted(FAMILY_SPECS.items()))
def test_every_family_builds_its_kvpress_press(spec, press):
    built = parse_action(spec).make_press(100)
    assert type(built).__name__ == press


def test_family_fields_reach_the_kvpress_press():
    d = parse_action("decoding-knorm:interval=7,target=30,buffer=5").make_press(100)
    assert (d.compression_interval, d.target_size, d.hidden_states_buffer_size) == (7, 30, 5)
    assert type(d.base_press).__name__ == "KnormPress"
    a = parse_action("adakv-snapkv:ratio=0.5,alpha_safeguard=0.3,window_size=8").make_press(100)
    assert a.alpha_safeguard == 0.3 and a.press.window_size == 8
    assert compute_n_kept(100, a.compression_ratio) == 50
    c = parse_action("snapkv:ratio=0.8+knorm:ratio=0.5").make_press(100)
    # the second press sees the first's 80 entries and keeps floor(0.5 * 80)
    assert compute_n_kept(100, c.presses[0].compression_ratio) == 80
    assert compute_n_kept(80, c.presses[1].compression_ratio) == 40
    p = parse_action("perlayer-knorm:ratios=0.9/0.25").make_press(10)
    assert [compute_n_kept(10, r) for r in p.compression_ratios] == [9, 2]


def test_chunk_kept_count_by_hand():
    # 50 entries in chunks of 16: 16, 16, 16, 2; ratio 0.3 keeps 4, 4, 4 and max(1, 0) = 1
    action = parse_action("chunk-knorm:ratio=0.3,chunk_length=16")
    assert action.kept(50) == 13
    press = action.make_press(50)
    assert [compute_n_kept(c, press.compression_ratio) for c in (16, 2)] == [4, 1]


def test_mid_ratio_lands_on_every_count():
    for n in range(1, 400):
        for kept in range(1, n + 1):
            assert int(n * (1 - mid_ratio(kept, n))) == kept, (kept, n)


def test_every_kvpress_press_is_offered_or_refused_with_a_reason():
    presses = {name for name in dir(kvpress) if name.endswith("Press")} - {"BasePress",
                                                                          "ScorerPress"}
    offered = set(SCORERS.values()) | {f.press_name for f in FAMILIES.values() if f.press} | {
        "PyramidKVPress"} | {name for f in FAMILIES.values() for name in f.also_presses}
    assert presses - offered == set(NOT_OFFERED) | set(GENERAL_PATH)
    assert not set(NOT_OFFERED) & set(GENERAL_PATH)
    for name, why in (NOT_OFFERED | GENERAL_PATH).items():
        with pytest.raises(ValueError) as info:
            parse_action(f"{name}:ratio=0.5")
        assert why in str(info.value) and name in str(info.value)
        if name in GENERAL_PATH:
            assert "press object" in str(info.value) and "--presses" in str(info.value)


def test_split_actions():
    assert split_actions("snapkv-half, recent-half") == ("snapkv-half", "recent-half")
    assert split_actions("snapkv:budget=256,window_size=32,knorm:ratio=0.5") == (
        "snapkv:budget=256,window_size=32", "knorm:ratio=0.5")
    assert split_actions("decoding-knorm:interval=8,target=64,adakv-snapkv:ratio=0.5") == (
        "decoding-knorm:interval=8,target=64", "adakv-snapkv:ratio=0.5")
    assert split_actions("snapkv:ratio=0.5+decoding-knorm:interval=8,target=64,full") == (
        "snapkv:ratio=0.5+decoding-knorm:interval=8,target=64", "full")
    for spec in split_actions("snapkv:ratio=0.5+decoding-knorm:interval=8,target=64,full"):
        parse_action(spec)


DONE_WHEN = ("full,kivi:bits=2,kivi:bits=4,gguf:k=q8_0,v=q8_0,gguf:k=q4_0,v=q4_0,"
             "snapkv:ratio=0.5+kivi:bits=4")


def test_split_actions_keeps_a_gguf_pair_and_kivi_options_in_one_spec():
    # issue 22's command: the comma inside gguf:k=..,v=.. belongs to the gguf spec
    assert split_actions(DONE_WHEN) == (
        "full", "kivi:bits=2", "kivi:bits=4", "gguf:k=q8_0,v=q8_0", "gguf:k=q4_0,v=q4_0",
        "snapkv:ratio=0.5+kivi:bits=4")
    assert split_actions("kivi:bits=2,group=32,residual=64,snapkv:ratio=0.5+gguf:v=q4_1,"
                         "k=q8_0, recent-half") == (
        "kivi:bits=2,group=32,residual=64", "snapkv:ratio=0.5+gguf:v=q4_1,k=q8_0",
        "recent-half")
    for spec in split_actions(DONE_WHEN):
        parse_action(spec)


def test_actions_command_lists_quantizations_with_bits_per_element():
    import gguf

    result = CliRunner().invoke(app, ["actions"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    section = lines[lines.index(next(x for x in lines if x.startswith("Quantizations"))) + 1:]
    rows = {line.split()[0]: line.split()[1:] for line in section[:section.index("")]}
    # llama.cpp's block layout from the gguf package: bytes per block of 32 elements
    sizes = gguf.GGML_QUANT_SIZES
    types = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q5_1": gguf.GGMLQuantizationType.Q5_1, "q5_0": gguf.GGMLQuantizationType.Q5_0,
             "q4_1": gguf.GGMLQuantizationType.Q4_1, "q4_0": gguf.GGMLQuantizationType.Q4_0}
    want = {f"gguf:k={name},v={name}": 8 * sizes[t][1] / sizes[t][0]
            for name, t in types.items()}
    # KIVI: b bits plus a float16 scale and zero point per group of 32 (2 x 16 / 32 = 1 bit)
    want |= {f"kivi:bits={b}[,group=32][,residual=128]": b + 2 * 16 / 32 for b in (2, 4, 8)}
    want |= {f"fp8:{f}[,scale=1]": 8 for f in ("e4m3", "e5m2")}  # one byte an entry
    assert set(rows) == set(want)
    for spec, bits in want.items():
        assert float(rows[spec][0]) == bits and rows[spec][1] == "bits", spec
    assert want["gguf:k=q4_0,v=q4_0"] == 4.5 and want["gguf:k=q8_0,v=q8_0"] == 8.5


def test_actions_help_and_readme_list_every_action():
    text = actions_help()
    readme = (Path(__file__).resolve().parents[1] / "docs" / "actions.md").read_text()
    for name in NAMED_ACTIONS:
        assert name in text and f"`{name}`" in readme
    for form, press, *_ in family_table():
        assert form in text and f"`{form}`" in readme, form
        if press.endswith("Press"):
            assert press in readme
    for short, cls in SCORERS.items():
        assert f"{short} ({cls})" in text and f"`{short}`" in readme
    for name in NOT_OFFERED:
        assert name in text and name in readme


def test_cli_prints_the_action_list():
    for args in (["run", "--actions", "help"], ["actions"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "adakv-<scorer>" in result.output and "QFilterPress" in result.output


# --- hostile specs (issue 34): one line naming the value and what is allowed ---------------


@pytest.mark.parametrize("spec, match", [
    ("snapkv:ratio=0.5,window_size=-5", r"window_size must be an integer >= 1; got -5$"),
    ("snapkv:ratio=0.5,window_size=0", r"window_size must be an integer >= 1; got 0$"),
    ("snapkv:ratio=0.5,kernel_size=-1", r"kernel_size must be an odd integer >= 1; got -1$"),
    ("snapkv:ratio=0.5,kernel_size=100000",
     r"kernel_size must be an odd integer >= 1; got 100000$"),
    ("snapkv:ratio=0.5,kernel_size=4", r"kernel_size must be an odd integer >= 1; got 4$"),
    ("adakv-snapkv:ratio=0.5,alpha_safeguard=2", r"alpha_safeguard must be a number within"),
    ("pyramidkv:ratio=0.5,beta=0", r"beta must be an integer >= 1; got 0$"),
    ("recent:ratio=0.5,n_sink=-1", r"n_sink must be an integer >= 0; got -1$"),
    ("snapkv:ratio=0.5,ratio=0.9", r"ratio must be given once; got ratio=0.5 and ratio=0.9$"),
    ("snapkv:ratio=0.5,window_size=4,window_size=8", r"window_size must be given once"),
    ("kivi:bits=4,bits=8", r"bits must be given once; got bits=4 and bits=8$"),
    ("snapkv:ratio=0.5+kivi:bits=4,bits=8", r"bits must be given once"),
])
def test_hostile_fields_raise_one_typed_line(spec, match):
    with pytest.raises(ActionError, match=match) as info:
        parse_action(spec)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_empty_action_list_names_actions_not_a_toml_table():
    for text in ("", " , ", ","):
        with pytest.raises(ActionError, match=r"--actions must be a comma list of at least one "
                                              r"action .*; got "):
            split_actions(text)


def test_chains_with_fields_split_on_the_command_line():
    assert split_actions("snapkv:ratio=0.5,window_size=4+kivi:bits=4,recent-half") == (
        "snapkv:ratio=0.5,window_size=4+kivi:bits=4", "recent-half")
    assert split_actions("snapkv:ratio=0.5,window_size=4+knorm:ratio=0.5,kivi:bits=4,group=32"
                         ) == ("snapkv:ratio=0.5,window_size=4+knorm:ratio=0.5",
                               "kivi:bits=4,group=32")
    action = parse_action(split_actions("snapkv:ratio=0.5,window_size=4+kivi:bits=4")[0])
    assert action.stages[0].field("window_size") == 4 and action.quantization is not None


@pytest.mark.parametrize("actions, match", [
    ("", "--actions must be a comma list of at least one action"),
    ("snapkv:ratio=0.5,window_size=-5", "window_size must be an integer >= 1; got -5"),
    ("snapkv:ratio=0.5,kernel_size=100000", "kernel_size must be an odd integer >= 1"),
    ("snapkv:ratio=0.5,ratio=0.9", "ratio must be given once"),
    ("kivi:bits=4,bits=8", "bits must be given once"),
])
def test_cli_refuses_hostile_actions_in_one_line(tmp_path, actions, match):
    result = CliRunner().invoke(app, ["run", "--actions", actions, "--out", str(tmp_path / "r")])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert match in lines[0] and "[study]" not in lines[0], lines[0]


@pytest.mark.parametrize("spec", [
    "snapkv-half", "recent-90", "knorm:ratio=0.3", "snapkv:ratio=0.5,window_size=32",
    "adakv-snapkv:ratio=0.5,alpha_safeguard=0.1", "criticalkv-knorm:ratio=0.8",
    "block-knorm:ratio=0.5,block_size=8", "chunk-knorm:ratio=0.5,chunk_length=16",
    "chunkkv-snapkv:ratio=0.3,chunk_length=8", "pyramidkv:ratio=0.5", "pyramidkv:ratio=0.3",
    "perlayer-knorm:ratios=0.9/0.3", "snapkv:ratio=0.8+knorm:ratio=0.5",
    "snapkv:ratio=0.5+decoding-knorm:interval=32,target=256"])
def test_kvpress_call_rebuilds_the_press_kvdrift_runs(spec):
    # the Python that `kvdrift actions` and run.json print is the press kvdrift builds
    action = parse_action(spec)
    rebuilt = eval(action.kvpress_call(), vars(kvpress))  # noqa: S307 (kvdrift's own text)
    assert repr(rebuilt) == repr(action.make_press(200)), action.kvpress_call()


def test_departures_are_named_and_hold():
    text = actions_help()
    assert "= PyramidKVPress" not in text and "= SnapKVPress(compression_ratio=0.5)" in text
    assert text.count("departs from kvpress:") == len([f for f in FAMILIES.values()
                                                       if f.departs])
    # ratio 0.1 at n = 20: kvpress's int(20 x (1 - 0.9)) keeps 1, kvdrift floor(2.0) = 2
    assert compute_n_kept(20, 0.9) == 1 and parse_action("knorm:ratio=0.1").kept(20) == 2
    assert "r=0.1, n=20: 2, not 1" in parse_action("knorm:ratio=0.1").departures()[0]
