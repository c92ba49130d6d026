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
def smollm2(embedded_smollm2):
    return embedded_smollm2


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
    return docs, factory, steps, reps, analyze(steps, reps, AnalysisOptions(bootstrap=200))


def generate_greedy(loaded, factory, doc) -> list[int]:
    """Greedy ``generate`` on the factory's prompt ids: the tokens before the first EOS."""
    ids = factory.prompt_ids(doc)
    with torch.no_grad():
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=H)
    new = out[0, ids.shape[1]:].tolist()
    eos = loaded.model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    return new[:new.index(eos)] if eos in new else new


@pytest.mark.slow
def test_full_has_equal_scores_and_no_flips(study):
    _, _, _, reps, result = study
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
    docs, factory, steps, reps, result = study
    tokens = {doc.id: generate_greedy(smollm2, factory, doc) for doc in docs}
    want = {doc.id: score_text(doc, factory.decode(tokens[doc.id])) for doc in docs}
    eos = factory.loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for action in ("full", "snapkv-half"):
        mine = reps[reps.action == action]
        for doc_id, score in want.items():
            x = steps[(steps.action == action) & (steps.doc_id == doc_id)
                      & (steps.replicate == 0)].sort_values("t")["x_token"].tolist()
            assert (x[:x.index(eos)] if eos in x else x) == tokens[doc_id]  # X is greedy P
            # greedy: every replicate of a document is the same text
            assert mine.loc[mine.doc_id == doc_id, "score_x"].tolist() == [score, score]
        acc_p = {t.action: t for t in result.task}[action].stats["acc_p"].estimate
        assert acc_p == pytest.approx(np.mean(list(want.values())))
