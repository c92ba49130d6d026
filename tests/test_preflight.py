"""Issue 52, item 5: every refusal that needs no model comes before torch, transformers and
kvpress are imported (each in a fresh interpreter: the check is which modules were loaded, not
a time), and the model-free copies of names and rules agree with the full parsers."""

from __future__ import annotations

import pytest

from kvdrift import preflight
from kvdrift.lm.grammar import values
from kvdrift.lm.grammar.fields import ActionError
from kvdrift.lm.loading import settings as loading_settings
from kvdrift.run import settings as run_settings
from tests.test_hostile_refusals import fresh_cli

DOCS = '{"id": "a", "prompt": "The cat sat on the mat. Where did the cat sit?"}\n'
DUPLICATE_ENDPOINTS = """[study]
models = ["smollm2"]
actions = ["full", "snapkv-half"]
[[documents]]
source = "jsonl"
path = "docs.jsonl"
[analysis]
endpoints = ["R(snapkv-half) - R(full)", "R(snapkv-half) - R(full)"]
"""
BAD_DEVICE_TOML = DUPLICATE_ENDPOINTS.replace('["full", "snapkv-half"]', '["full"]\n'
                                              'device = "tpu"').split("[analysis]")[0]
MISSING_DOCS_TOML = DUPLICATE_ENDPOINTS.replace("docs.jsonl", "gone.jsonl").split("[analysis]")[0]


@pytest.mark.parametrize("args, message", [
    (("run", "--docs", "docs.jsonl", "--actions", "snapkv:ratio=2"),
     "error: action 'snapkv:ratio=2': SnapKVPress: ratio (fraction of entries kept) must be a "
     "number within (0, 1]; got 2.0"),
    (("run", "--docs", "docs.jsonl", "--actions", "kivi:bits=3"),
     "error: action 'kivi:bits=3': kivi bits must be one of 2, 4, 8; got 3"),
    (("run", "--docs", "docs.jsonl", "--actions", "knorm:budget=0"),
     "error: action 'knorm:budget=0': KnormPress: budget (entries kept) must be an integer "
     ">= 1; got 0"),
    (("run", "--docs", "docs.jsonl", "--actions", "snapkv:ratio=0.5,kernel_size=4"),
     "error: action 'snapkv:ratio=0.5,kernel_size=4': SnapKVPress: kernel_size must be an odd "
     "integer >= 1; got 4"),
    (("run", "--docs", "docs.jsonl", "--actions", "snapkv:ratio=0.5+gguf:k=q9,v=f16"),
     "error: action 'snapkv:ratio=0.5+gguf:k=q9,v=f16': llama.cpp cache type for k= must be "
     "one of f16, q8_0, q5_1, q5_0, q4_1, q4_0; got 'q9'"),
    (("run", "--docs", "docs.jsonl", "--actions", "fp8:e3m4"),
     "error: action 'fp8:e3m4': fp8 format must be one of e4m3, e5m2; got 'e3m4'"),
    (("run", "--docs", "docs.jsonl", "--dtype", "nope"),
     "error: dtype must be one of float32, bfloat16, float16; got 'nope'"),
    (("run", "--docs", "docs.jsonl", "--device", "tpu"),
     "error: device must be one of auto, cpu, cuda, cuda:N; got 'tpu'"),
    (("run", "--docs", "docs.jsonl", "--device", "cuda:x"),
     "error: device must be one of auto, cpu, cuda, cuda:N; got 'cuda:x'"),
    (("run", "--docs", "docs.jsonl", "--estimator", "nope"),
     "error: estimator must be one of rollout, swrb; got 'nope'"),
    (("run", "--docs", "docs.jsonl", "--estimator", "swrb", "--attribution"),
     "error: attribution must be false with estimator 'swrb'; it needs complete coupled "
     "rollouts (estimator = \"rollout\")"),
    (("run", "--docs", "gone.jsonl"),
     "error: document file gone.jsonl does not exist; name a JSONL file of {\"id\", "
     "\"prompt\"} objects, one a line"),
    (("study", "dup.toml"),
     "error: endpoints must each be given once (each one divides alpha); got "
     "'R(snapkv-half) - R(full)' and 'R(snapkv-half) - R(full)'"),
    (("study", "device.toml"), "error: device must be one of auto, cpu, cuda, cuda:N; got 'tpu'"),
    (("study", "gone.toml"), "error: document file gone.jsonl does not exist"),
], ids=["ratio", "kivi-bits", "budget", "kernel", "gguf", "fp8", "dtype", "device",
        "device-index", "estimator", "attribution", "docs", "toml-endpoints", "toml-device",
        "toml-docs"])
def test_model_free_refusals_come_before_torch_transformers_and_kvpress(tmp_path, args,
                                                                         message):
    (tmp_path / "docs.jsonl").write_text(DOCS)
    (tmp_path / "dup.toml").write_text(DUPLICATE_ENDPOINTS)
    (tmp_path / "device.toml").write_text(BAD_DEVICE_TOML)
    (tmp_path / "gone.toml").write_text(MISSING_DOCS_TOML)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, loaded, stderr, _ = fresh_cli(*args, "--out", "out", cwd=tmp_path)
    assert code == 2 and stderr.startswith(message), stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert loaded == [], f"{' '.join(args)} imported {loaded} before refusing"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_the_model_free_copies_are_the_loaders_and_estimators():
    from kvdrift.lm.loading.model import DTYPES
    from kvdrift.lm.quantized import numerics, transform
    from kvdrift.run.estimators import ESTIMATORS

    assert run_settings.ESTIMATOR_NAMES == tuple(ESTIMATORS)
    assert run_settings.COMPLETE_ESTIMATORS == tuple(
        n for n, e in ESTIMATORS.items() if e.records.complete_branches)
    assert loading_settings.DTYPE_NAMES == tuple(DTYPES)
    assert values.KIVI_BITS == transform.KIVI_BITS
    assert values.GGUF_TYPE_NAMES == tuple(numerics.GGUF_TYPES)
    assert values.FP8_FORMAT_NAMES == tuple(numerics.FP8_FORMATS)
    from kvdrift.lm.actions import presses

    assert values.SCORER_CLASS_NAMES == presses.SCORERS


ACCEPTED = ("full", "snapkv-half", "snapkv:ratio=0.5", "knorm:budget=7", "snapkv:ratio=1",
            "snapkv:ratio=0.5,window_size=4,kernel_size=3", "perlayer-knorm:ratios=0.9/0.5",
            "decoding-knorm:interval=32,target=256", "snapkv:ratio=0.5+kivi:bits=4",
            "kivi:bits=2,group=16,residual=64", "gguf:k=q4_0,v=f16", "fp8:e5m2,scale=2",
            "adakv-snapkv:ratio=0.5,alpha_safeguard=0.1", "streaming_llm:ratio=0.3,n_sink=0")
REFUSED = ("snapkv:ratio=0", "snapkv:ratio=1.5", "snapkv:ratio=nan", "snapkv:ratio=x",
           "knorm:budget=-1", "knorm:budget=1.5", "perlayer-knorm:ratios=0.9/0",
           "snapkv:ratio=0.5,window_size=0", "snapkv:ratio=0.5,kernel_size=2",
           "adakv-snapkv:ratio=0.5,alpha_safeguard=2", f"snapkv:ratio=0.5,window_size={2**40}",
           "kivi:bits=3", "kivi:group=32", "kivi:bits=2,group=0", "kivi:bits=2,residual=48",
           "kivi:bits=x", "gguf:k=q9,v=f16", "gguf:k=f16,v=Q3", "fp8:e3m4",
           "snapkv:ratio=0.5+kivi:bits=5")


@pytest.mark.parametrize("spec", ACCEPTED)
def test_the_early_check_passes_every_spec_the_full_parser_runs(spec):
    from kvdrift.lm.actions.spec import parse_action

    parse_action(spec)  # a spec kvdrift runs
    preflight.check_actions([spec])  # is never refused early


@pytest.mark.parametrize("spec", REFUSED)
def test_the_early_check_refuses_what_the_full_parser_refuses(spec):
    from kvdrift.lm.actions.spec import parse_action

    with pytest.raises(ValueError) as late:
        parse_action(spec)
    with pytest.raises(ActionError) as early:
        preflight.check_actions([spec])
    assert str(early.value).startswith(f"action {spec!r}: ")
    assert len(str(early.value).splitlines()) == 1
    if "must be" in str(late.value) and "must be" in str(early.value):  # the same rule
        assert str(early.value).split("; got ")[0] == str(late.value).split("; got ")[0]


def test_a_name_the_users_presses_define_is_left_to_them():
    preflight.check_actions(["mine:ratio=2"], defined={"mine:ratio=2"})


RECORDED = {"name": "store", "models": ["smollm2"], "actions": ["full"], "replicates": 2,
            "horizon": 4, "temperature": 1.0, "estimator": "rollout", "depths": [], "seed": 0,
            "batch": 0, "device": "auto", "dtype": "float32", "chat_template": True,
            "documents": [{"source": "jsonl", "path": "docs.jsonl"}], "analysis": {}}


def a_store(tmp_path):
    """A store's folder as a finished ``kvdrift run`` leaves it (its run.json and marker)."""
    import json

    store = tmp_path / "store"
    store.mkdir()
    (store / "run.json").write_text(json.dumps({"config": RECORDED, "versions": {}}))
    (store / ".kvdrift").write_text("kvdrift run\n")
    (tmp_path / "docs.jsonl").write_text(DOCS)
    return store


RUN = ("run", "--docs", "docs.jsonl", "--actions", "full", "--replicates", "2")


def test_a_resume_with_other_settings_is_refused_before_torch(tmp_path):
    a_store(tmp_path)
    code, loaded, stderr, _ = fresh_cli(*RUN, "--horizon", "8", "--seed", "3", "--out",
                                        "store", cwd=tmp_path)
    assert code == 2 and loaded == [], (stderr, loaded)
    assert stderr.strip() == ("error: store holds a run with a different configuration "
                              "(differs in: horizon, seed); rerun with the same arguments to "
                              "resume, or use another output directory")


def test_a_busy_store_is_refused_before_torch(tmp_path):
    import os

    from kvdrift.run.lock import StoreLock

    store = a_store(tmp_path)
    (tmp_path / "s.toml").write_text(DUPLICATE_ENDPOINTS.split("[analysis]")[0])
    with StoreLock(store):
        code, loaded, stderr, _ = fresh_cli(*RUN, "--horizon", "4", "--out", "store",
                                            cwd=tmp_path)
        study_code, study_loaded, study_err, _ = fresh_cli(
            "study", "s.toml", "--out", "store", cwd=tmp_path)
    assert code == 2 and loaded == [], (stderr, loaded)
    assert stderr.strip() == (f"error: store is being written by another kvdrift process (PID "
                              f"{os.getpid()}); wait for it to finish, or use another output "
                              "directory")
    assert study_code == 2 and study_loaded == [] and "is being written by" in study_err


@pytest.mark.parametrize("args, message", [
    (("show", "nowhere"), "error: nowhere does not exist; name a run or study directory"),
    (("show", "empty"), "error: empty is not a kvdrift run or study directory (it has no "
                        "run.json)"),
    (("report", "nowhere"), "error: nowhere does not exist; name a run or study directory"),
    (("report", "store", "--bootstrap", "-5"),
     "error: --bootstrap must be an integer >= 0"),
    (("report", "store", "--alpha", "2"), "error: --alpha must be within (0, 1); got 2.0"),
    (("plan", "empty", "--target", "R(full)", "--halfwidth", "0.1"),
     "error: empty is not a kvdrift run or study directory"),
    (("plan", "store", "--target", "R(full)", "--halfwidth", "0.1", "--alpha", "1"),
     "error: --alpha must be within (0, 1); got 1.0"),
    (("predict", "store", "nowhere", "--contrast", "full - full"),
     "error: nowhere does not exist; name a run or study directory"),
    (("predict", "store", "store", "--contrast", "full - full", "--margin", "0"),
     "error: --margin must be a finite number > 0; got 0.0"),
    (("finite-state", "--horizon", "13"),
     "error: horizon H must be at most 12 for the exact enumeration of 2-token systems"),
    (("finite-state", "--replicates", "1"),
     "error: replicates must be an integer >= 2 (to estimate a variance); got 1"),
], ids=["show-missing", "show-empty", "report-missing", "report-bootstrap", "report-alpha",
        "plan-empty", "plan-alpha", "predict-missing", "predict-margin", "finite-horizon",
        "finite-replicates"])
def test_reading_commands_refuse_before_torch_transformers_and_kvpress(tmp_path, args, message):
    a_store(tmp_path)
    (tmp_path / "empty").mkdir()
    code, loaded, stderr, _ = fresh_cli(*args, cwd=tmp_path)
    assert code == 2 and stderr.startswith(message), stderr
    assert len(stderr.strip().splitlines()) == 1 and loaded == [], (stderr, loaded)


def test_the_python_api_checks_its_arguments_before_any_work(tmp_path):
    """``kvdrift.measure(bootstrap=-5)`` raised only after the whole study had run; here no
    model, document or record is touched (the documents named do not exist)."""
    import subprocess
    import sys

    code = ("import sys, kvdrift\n"
            "for kw in ({'bootstrap': -5}, {'alpha': 2}):\n"
            "    try:\n        kvdrift.measure('smollm2', docs='gone.jsonl', **kw)\n"
            "    except ValueError as e:\n        print(e)\n"
            "    try:\n        kvdrift.analyze('gone', **kw)\n"
            "    except ValueError as e:\n        print(e)\n"
            "print([m for m in ('torch', 'transformers', 'kvpress', 'pandas') "
            "if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert done.stdout.splitlines() == [
        "bootstrap draws must be an integer >= 0; got -5",
        "bootstrap draws must be an integer >= 0; got -5",
        "alpha must be within (0, 1); got 2", "alpha must be within (0, 1); got 2", "[]"], (
        done.stdout + done.stderr[-2000:])


def test_a_loose_cache_root_is_refused_before_torch(tmp_path, monkeypatch):
    """The converted cache's refusals need no model: a cache root others can write is refused
    by `kvdrift run` on the embedded model before torch, transformers or kvpress load."""
    import os

    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o777)  # writable by others, no sticky bit
    monkeypatch.setenv("KVDRIFT_CACHE", str(root))
    (tmp_path / "docs.jsonl").write_text(DOCS)
    code, loaded, stderr, _ = fresh_cli("run", "--docs", "docs.jsonl", "--actions",
                                        "snapkv-half", "--out", "out", cwd=tmp_path)
    assert code == 2 and stderr.startswith(f"error: cache folder {root}: {root} is writable "
                                           f"by its group or others"), stderr
    assert loaded == [], f"imported {loaded} before refusing"
    assert not (tmp_path / "out").exists()


def test_a_converted_folder_its_manifest_does_not_vouch_for_is_refused_before_torch(
        tmp_path, monkeypatch):
    """A converted folder holding a file the conversion did not write (and no sealed manifest)
    is refused before any model loads, in one line naming the folder."""
    from kvdrift.lm.loading import embedded

    root = tmp_path / "cache"
    monkeypatch.setenv("KVDRIFT_CACHE", str(root))
    folder = embedded.smollm2_cache_dir()
    folder.mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (folder / "config.json").write_text("{}")
    (tmp_path / "docs.jsonl").write_text(DOCS)
    code, loaded, stderr, _ = fresh_cli("run", "--docs", "docs.jsonl", "--actions",
                                        "snapkv-half", "--out", "out", cwd=tmp_path)
    assert code == 2 and str(folder) in stderr and "kvdrift-manifest.json" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert loaded == [], f"imported {loaded} before refusing"
