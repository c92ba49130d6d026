"""Study configs: shipped examples parse; mistakes are named before any model loads."""

from pathlib import Path

import pytest

import kvdrift
from kvdrift.run.executors import ExecutorConfig
from kvdrift.study import fixed_documents
from kvdrift.study_config import load_study, parse_study
from tests.messages import whole

CONFIGS = Path(kvdrift.__file__).parent / "configs"


def base(**study):
    return {"study": {"models": ["smollm2"], "actions": ["snapkv-half"]} | study,
            "documents": [{"source": "ruler", "lengths": [512], "per_stratum": 1}]}


@pytest.mark.parametrize("name", ["paper-study1", "paper-study2", "cpu-demo", "cpu-dev",
                                  "cpu-eval", "cpu-replication", "cpu-long"])
def test_shipped_configs_parse(name):
    config = load_study(CONFIGS / f"{name}.toml")
    assert config.name == name and config.models and config.run.actions


def test_shipped_configs_are_found_by_name_and_others_refused():
    assert kvdrift.shipped_config("cpu-demo") == CONFIGS / "cpu-demo.toml"
    with pytest.raises(ValueError, match=whole(
            "shipped config must be one of cpu-demo, cpu-dev, cpu-eval, cpu-long, "
            "cpu-replication, paper-study1, paper-study2; got 'cpu'")):
        kvdrift.shipped_config("cpu")


def test_cpu_long_is_a_long_generation_under_a_decoding_press_and_its_prefill_counterpart():
    config = load_study(CONFIGS / "cpu-long.toml")
    assert config.run.horizon == 1024 and config.models == ("smollm2",)
    assert config.run.actions == ("decoding-knorm:interval=64,target=256", "knorm:ratio=0.5")
    assert not config.chat_template  # the embedded model writes the chain only without it
    (source,) = config.documents
    assert source.config.families == ("chain",)


def test_cohort_is_saved_only_when_named():
    assert parse_study(base(cohort="evaluation")).as_dict()["cohort"] == "evaluation"
    assert "cohort" not in parse_study(base()).as_dict()  # older study directories resume


def test_cpu_prediction_pair_differs_only_in_documents():
    dev, ev = load_study(CONFIGS / "cpu-dev.toml"), load_study(CONFIGS / "cpu-eval.toml")
    assert (dev.cohort, ev.cohort) == ("development", "evaluation")
    assert dev.run == ev.run and dev.models == ev.models
    dev_ruler, ev_ruler = dev.documents[0].config, ev.documents[0].config
    assert dev_ruler.seed != ev_ruler.seed  # disjoint document ids
    assert dev_ruler.documents_per_stratum * len(dev_ruler.families) >= 6


def test_paper_study2_has_eight_endpoints():
    config = load_study(CONFIGS / "paper-study2.toml")
    assert len(config.analysis.endpoints) * len(config.models) == 8


@pytest.mark.parametrize(
    "data, message",
    [
        ({"study": {"actions": ["full"]}, "documents": [{"source": "ruler"}]},
         "missing the key 'models'"),
        (base(actions=["snapkv-halfish"]), "snapkv-halfish"),
        (base(replicates="many"), "[study].replicates must be an integer"),
        (base() | {"documents": []}, "at least one [[documents]]"),
        (base() | {"documents": [{"source": "jsonl"}]}, "missing the key 'path'"),
        (base() | {"documents": [{"source": "ruler", "families": ["nope"]}]}, "nope"),
        (base() | {"analysis": {"endpoints": ["B(recent-half)"]}},
         "action in endpoint 'B(recent-half)' must be one of the actions of the study: "
         "snapkv-half; got 'recent-half'"),
        (base() | {"analysis": {"alpha": 2.0}}, "alpha must be within (0, 1)"),
        (base(executor="ray", cpus_per_worker=0), "cpus_per_worker must be a number > 0"),
        (base(executor="ray", gpus_per_worker=-1), "gpus_per_worker must be a number >= 0"),
    ],
)
def test_config_mistakes_are_named(data, message):
    with pytest.raises(ValueError) as info:
        parse_study(data)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "data, pattern",
    [
        (base(replicatez=3),
         r"^key in \[study\] must be one of name, models, actions, .+; got 'replicatez'$"),
        (base(estimator="magic"), whole("estimator must be one of rollout, swrb; got 'magic'")),
        (base() | {"documents": [{"source": "web"}]},
         whole("document source in [[documents]] #1 must be one of ruler, jsonl, hf, records; "
               "got 'web'")),
        (base() | {"documents": [{"families": ["vt"]}]},
         whole("document source in [[documents]] #1 must be one of ruler, jsonl, hf, records; "
               "got None")),
        (base() | {"documents": [{"source": "ruler"}, 3]},
         whole("[[documents]] #2 must be a table")),
        (base() | {"analysis": {"bootstraps": 5}},
         whole("key in [analysis] must be one of bootstrap, alpha, endpoints, seed; "
               "got 'bootstraps'")),
        (base(cohort="dev"),
         whole("[study].cohort must be one of development, evaluation; got 'dev'")),
        (base(executor="magic"), whole("executor must be one of local, ray; got 'magic'")),
        (base() | {"extra": {}},
         whole("section must be one of study, documents, analysis; got 'extra'")),
    ],
)
def test_config_names_outside_their_list_are_refused_whole(data, pattern):
    with pytest.raises(ValueError, match=pattern):
        parse_study(data)


def test_executor_settings_parse_and_stay_out_of_the_stored_config():
    ray = parse_study(base(executor="ray", ray_address="auto", gpus_per_worker=0.5,
                           cpus_per_worker=2))
    assert ray.executor == ExecutorConfig("ray", "auto", 0.5, 2.0)
    assert parse_study(base()).executor == ExecutorConfig()
    # Both executors write the same records, so a study resumes under either.
    assert ray.as_dict() == parse_study(base()).as_dict()
    # --ray-address implies the ray executor; --executor local with an address is refused.
    assert ExecutorConfig().overridden(None, "auto") == ExecutorConfig("ray", "auto")
    with pytest.raises(ValueError, match="--ray-address needs the ray executor"):
        ExecutorConfig().overridden("local", "auto")
    # A model placed on the CPU asks for no GPU unless told to.
    assert ExecutorConfig("ray").for_device("cpu").gpus_per_worker == 0
    assert ExecutorConfig("ray", "ray://10.0.0.1:6379").ray_address == "ray://10.0.0.1:6379"
    for bad in ("", " ", "10.0.0.1", ":6379", "host:port", 6379):
        with pytest.raises(ValueError, match=whole(
                f"ray_address must be 'auto' or HOST:PORT (e.g. 10.0.0.1:6379); got {bad!r}")):
            ExecutorConfig("ray", bad)
        with pytest.raises(ValueError, match=whole(
                f"ray_address must be 'auto' or HOST:PORT (e.g. 10.0.0.1:6379); got {bad!r}")):
            ExecutorConfig().overridden(None, bad)
    assert ExecutorConfig("ray", gpus_per_worker=1).for_device("cpu").gpus_per_worker == 1


def test_empty_document_source_is_refused_before_loading(tmp_path):
    empty = tmp_path / "docs.jsonl"
    empty.write_text("")
    config = parse_study(base() | {"documents": [{"source": "jsonl", "path": str(empty)}]})
    with pytest.raises(ValueError, match="no documents"):
        fixed_documents(config)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_study(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[study\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_study(bad)


def test_every_relative_path_in_a_toml_resolves_against_the_toml(tmp_path, monkeypatch):
    """A JSONL source's path, and an HF source's name where a folder of that name is beside
    the TOML, resolve against the TOML's folder, not the working directory; a hub id and an
    absolute path stay as written."""
    from kvdrift.data.document import Document
    from kvdrift.data.loaders import write_jsonl

    folder = tmp_path / "study"
    (folder / "data").mkdir(parents=True)
    (folder / "saved").mkdir()
    write_jsonl([Document("a", "text")], folder / "data" / "d.jsonl")
    absolute = write_jsonl([Document("b", "more")], tmp_path / "abs.jsonl")
    toml = folder / "s.toml"
    toml.write_text(
        '[study]\nmodels = ["smollm2"]\nactions = ["full"]\n'
        '[[documents]]\nsource = "jsonl"\npath = "data/d.jsonl"\n'
        f'[[documents]]\nsource = "jsonl"\npath = "{absolute}"\n'
        '[[documents]]\nsource = "hf"\nname = "saved"\nsplit = "test"\nprompt_field = "p"\n'
        '[[documents]]\nsource = "hf"\nname = "org/dataset"\nsplit = "test"\n'
        'prompt_field = "p"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_study("../study/s.toml")
    jsonl, other, saved, hub = config.documents
    assert Path(jsonl.path) == Path("../study") / "data" / "d.jsonl"
    assert [d.id for d in jsonl.documents()] == ["a"]
    assert other.path == str(absolute)
    assert Path(saved.name) == Path("../study") / "saved" and hub.name == "org/dataset"
