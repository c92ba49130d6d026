"""Task outcomes on the embedded SmolLM2 (slow): RULER-style needle documents, greedy decoding.

``full`` must give X = Y (equal scores, no flips), and the accuracy under P must be what
``model.generate`` (greedy) followed by the same scorer gives.
"""

import numpy as np
import pytest
import torch

from kvdrift.analysis.study import AnalysisOptions, analyze
from kvdrift.data.ruler import make_document
from kvdrift.data.scoring import score_text
from kvdrift.lm.factory import LMPairFactory
from kvdrift.run.runner import RunConfig, run_units
from kvdrift.run.store import RunStore

H = 16


@pytest.fixture(scope="module")
def smollm2():
    from kvdrift.lm.model import load_model

    return load_model("smollm2")


@pytest.fixture(scope="module")
def study(smollm2, tmp_path_factory):
    docs = [make_document("niah_single", 512, smollm2.tokenizer, seed=5, index=i,
                          needle_type="word") for i in range(3)]
    cfg = RunConfig(model="smollm2", actions=("full", "snapkv-half"), replicates=2, horizon=H,
                    temperature=0.0, seed=0)
    store = RunStore.open(tmp_path_factory.mktemp("task-study"), cfg.as_dict())
    factory = LMPairFactory(smollm2)
    run_units(cfg, docs, factory, store)
    steps, reps = store.read("steps").to_pandas(), store.read("replicates").to_pandas()
    return docs, factory, reps, analyze(steps, reps, AnalysisOptions(bootstrap=200))


def generate_score(loaded, factory, doc) -> float:
    """Greedy ``generate`` on the factory's prompt ids, decoded as the runner does, scored."""
    ids = factory.prompt_ids(doc)
    with torch.no_grad():
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=H)
    new = out[0, ids.shape[1]:].tolist()
    eos = loaded.model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    if eos in new:
        new = new[:new.index(eos)]
    return score_text(doc, factory.decode(new))


@pytest.mark.slow
def test_full_has_equal_scores_and_no_flips(study):
    _, _, reps, result = study
    full = reps[reps.action == "full"]
    assert full.score_x.notna().all() and (full.score_x == full.score_y).all()
    entry = {t.action: t for t in result.task}["full"].stats
    assert entry["acc_p"].estimate == entry["acc_q"].estimate
    for k in ("diff", "flips_lost", "flips_gained"):
        assert entry[k].estimate == 0 and entry[k].lo == 0 and entry[k].hi == 0
    out = result.to_json()
    assert [e["action"] for e in out["task"]] == ["full", "snapkv-half"]
    assert all(e["documents"] == 3 for e in out["task"])


@pytest.mark.slow
def test_accuracy_under_p_is_greedy_generate_then_score(smollm2, study):
    docs, factory, reps, result = study
    want = {doc.id: generate_score(smollm2, factory, doc) for doc in docs}
    for action in ("full", "snapkv-half"):
        mine = reps[reps.action == action]
        for doc_id, score in want.items():
            # greedy: every replicate of a document is the same text
            assert mine.loc[mine.doc_id == doc_id, "score_x"].tolist() == [score, score]
        acc_p = {t.action: t for t in result.task}[action].stats["acc_p"].estimate
        assert acc_p == pytest.approx(np.mean(list(want.values())))
