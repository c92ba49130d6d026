"""Issue 46: a misspelt action or family, a bad number or a bad output folder is refused before
torch, transformers or kvpress are imported (each refusal in a fresh interpreter), and the
static names those early checks read are the ones the press library gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import kvdrift
from kvdrift.lm.grammar import names as action_names

HEAVY = ("torch", "transformers", "kvpress")
_PROBE = """
import json, sys
from kvdrift.cli import app
try:
    app(args=sys.argv[1:], prog_name="kvdrift")
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def fresh_cli(*args: str, cwd) -> tuple[int, list[str], str, float]:
    """Exit code, heavy modules loaded by then, stderr and seconds of a fresh ``kvdrift``."""
    source = os.path.dirname(os.path.dirname(kvdrift.__file__))  # this kvdrift, not another
    env = os.environ | {"PYTHONPATH": os.pathsep.join(
        filter(None, (source, os.environ.get("PYTHONPATH"))))}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)
    seconds = time.perf_counter() - started
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["code"], report["loaded"], done.stderr, seconds


@pytest.mark.parametrize("args, message", [
    (("frontier", "--families", "nope"), "error: family 'nope': press must be one of cap,"),
    (("frontier", "--max-replicates", str(10**11)),
     "error: --max-replicates must be at most 4_096 (kvdrift's limit); got 100_000_000_000"),
    (("run", "--actions", "nope"), "error: action must be one of full, snapkv-half,"),
    (("run", "--horizon", "-1"), "error: --horizon must be an integer >= 1; got -1"),
    (("run", "--seed", str(10**29)), "error: --seed must be an integer within 0.."),
    (("study", "CONFIG", "--out", "/"), "error: output directory '/' is the file-system root"),
])
def test_refusals_come_before_torch_transformers_and_kvpress(args, message, tmp_path):
    config = os.path.join(os.path.dirname(kvdrift.__file__), "configs", "cpu-demo.toml")
    args = tuple(config if a == "CONFIG" else a for a in args)
    code, loaded, stderr, seconds = fresh_cli(*args, cwd=tmp_path)
    assert code == 2 and stderr.startswith(message), stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert loaded == [], f"{' '.join(args)} imported {loaded} before refusing ({seconds:.1f} s)"
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_static_names_are_the_press_library_s():
    from kvdrift.lm.actions import presses
    from kvdrift.lm.actions import spec as actions
    from kvdrift.lm.quantized import transform as quantization

    assert action_names.NAMED_ACTIONS == tuple(actions.NAMED_ACTIONS)
    assert action_names.SCORER_CLASSES == tuple(presses.scorer_classes())
    assert action_names.allowed_scorers() == presses.allowed_scorers()
    assert ", ".join(action_names.FAMILY_NAMES) == presses.family_names()
    assert action_names.PREFIX_FAMILIES == tuple(
        f.name for f in presses.FAMILIES.values() if f.wraps_scorers)
    assert action_names.OWN_SCORER_FAMILIES == {
        f.name: f.own_scorer.__name__ for f in presses.FAMILIES.values() if f.own_scorer}
    assert action_names.QUANTIZATIONS == tuple(quantization.QUANTIZATIONS)
    import kvpress

    assert action_names.KVPRESS_PRESSES == tuple(
        sorted(n for n in dir(kvpress) if n.endswith("Press")))


@pytest.mark.parametrize("spec", [
    "nope", "nope:ratio=0.5", "adakv-nope:ratio=0.5", "snapkv:ratio=0.5+nope:ratio=0.5",
    "Nope-snapkv:ratio=0.5", "snapkv-halfx"])
def test_an_unknown_name_is_refused_early_as_the_full_parser_refuses_it(spec):
    from kvdrift.lm.actions.spec import parse_action

    with pytest.raises(ValueError) as full:
        parse_action(spec)
    with pytest.raises(ValueError) as early:
        action_names.check_action_names(spec)
    assert str(early.value) == str(full.value)


@pytest.mark.parametrize("spec", [
    "full", "snapkv-half", "knorm:ratio=0.5", "adakv-snapkv:ratio=0.5", "pyramidkv:ratio=0.5",
    "PyramidKVPress:ratio=0.5", "SnapKVPress:ratio=0.5", "snapkv:ratio=0.5+kivi:bits=4",
    "KVzipPress:ratio=0.5", "AdaKVPress:ratio=0.5", "snapkv:ratio=2", "kivi:bits=3"])
def test_known_names_pass_the_early_check_whatever_else_is_wrong(spec):
    action_names.check_action_names(spec)  # fields and values: the full parser's
