"""Shared fixtures: a tiny randomly initialised Llama built in memory (no files, no network)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Before torch starts OpenMP: with the default active spin-wait, each small matmul on a
# 2-vCPU VM can stall ~16 ms waiting for the second thread; passive waiting avoids it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

# Under pytest-xdist (scripts/test.sh runs one worker per core) each worker keeps to its share
# of the cores: two workers of two threads each on two cores stall at every OpenMP barrier.
# The logits are bit-identical at one thread and at two (matmuls split rows, not sums).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

#: Test modules that must share one worker: they read the same session fixture's runs
#: (``kvpress_runs``), made once per worker.
_SHARED_WORKER = {"test_lm_presses.py": "kvpress_runs", "test_lm_shared_prefill.py": "kvpress_runs"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under ``--dist loadgroup`` a module's tests stay on one worker (module-level caches and
    module fixtures are made once), and modules that share a session fixture's runs share one."""
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group(_SHARED_WORKER.get(name, name)))


@pytest.fixture(scope="session")
def tiny_llama():
    """A 2-layer Llama (hidden 64, 4 heads, 2 KV heads, vocab 128) in float32 eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.2, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def embedded_smollm2():
    """The embedded SmolLM2 (a ``LoadedModel``), loaded once for the whole session: each load
    reads and checks 540 MB of weights. Tests leave it as they found it (presses remove their
    hooks on exit; attention switches are restored)."""
    from kvdrift.lm.loading.model import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def kvpress_runs():
    """kvpress's greedy runs kept for the session (``tests.test_lm_presses.generate_once``):
    the SmolLM2 tests of test_lm_presses and test_lm_shared_prefill compare kvdrift against
    the same runs, each made once (a test module imported twice keeps two copies of its own
    globals; a session fixture is one)."""
    return {}


#: What the docs' examples run on in the tests: the default documents at one task per family
#: (three 512-token tasks, not six). Every line of an example still runs, on half the documents.
ONE_TASK_PER_FAMILY = {"per_stratum": 1}


@pytest.fixture
def one_task_per_family(monkeypatch):
    """``kvdrift run`` and ``kvdrift.measure`` without documents generate one task per family."""
    from kvdrift import study_config

    monkeypatch.setattr(study_config, "DEFAULT_DOCUMENTS",
                        study_config.DEFAULT_DOCUMENTS | ONE_TASK_PER_FAMILY)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json")


def _save_tiny_model(out, **extra):
    """A 2-layer random Llama saved into ``out`` with the embedded SmolLM2 tokenizer."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    from kvdrift.lm.loading.model import smollm2_path

    source = smollm2_path()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, initializer_range=0.5,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2, **extra)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer random Llama saved with the embedded SmolLM2 tokenizer (loads like any model)."""
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_model_dir_hd64(tmp_path_factory):
    """``tiny_model_dir`` with head_dim 64, so llama.cpp's blocks of 32 fit (gguf actions)."""
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-model-hd64"), head_dim=64)
