"""The converted-weights cache is trusted only as far as its sealed digests: a planted link,
a foreign folder, a changed, extra or missing file, a manifest kvdrift did not seal, a cache
root others can write, or a folder converted from another GGUF is refused in one line before
anything is loaded; what is loaded is the bytes checked, so a folder swapped in after the
check never loads (the conversion is faked: no weights)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kvdrift.lm.loading import converted_cache
from kvdrift.lm.loading import model as lm_model
from kvdrift.lm.loading.embedded import SMOLLM2_CACHE_NAME
from tests.messages import whole


def _fake_convert(path: Path) -> None:
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model.safetensors").write_bytes(b"weights" * 100)
    (path / "tokenizer_config.json").write_text("{}")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh ``$KVDRIFT_CACHE`` whose conversion is faked and counted."""
    calls = []
    monkeypatch.setenv("KVDRIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(lm_model, "_convert_smollm2", lambda p: (calls.append(p),
                                                                 _fake_convert(p)))
    return calls


def _refusal(folder: Path, why: str) -> str:
    return whole(f"converted-weights cache {folder}: {why}; delete {folder} to convert the "
                 f"model again")


def test_a_conversion_is_private_and_records_every_file_and_its_source(cache, tmp_path):
    folder = lm_model.smollm2_path()
    assert stat.S_IMODE(os.lstat(tmp_path / "cache").st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    manifest = json.loads((folder / converted_cache.MANIFEST).read_text())
    assert manifest["source_sha256"] == lm_model.smollm2_gguf_digest()
    key = tmp_path / "cache" / converted_cache.KEY_FILE
    assert stat.S_IMODE(os.lstat(key).st_mode) == 0o600 and len(key.read_bytes()) == 32
    assert manifest["hmac"] == converted_cache.seal(manifest, key.read_bytes())
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors",
                                         "tokenizer_config.json"]
    assert lm_model.smollm2_path() == folder and len(cache) == 1


def test_a_link_planted_in_the_cache_is_refused(cache, tmp_path):
    other = tmp_path / "other-model"
    other.mkdir()
    _fake_convert(other)
    (tmp_path / "cache").mkdir()
    folder = lm_model.smollm2_cache_dir()
    folder.symlink_to(other)
    message = (f"converted model {folder} is a symbolic link; the converted-weights cache "
               f"takes no links (remove the link, or set KVDRIFT_CACHE to a folder)")
    with pytest.raises(ValueError, match=whole(message)):
        lm_model.smollm2_path()
    with pytest.raises(ValueError, match=whole(message)):
        lm_model.load_model()
    assert cache == []  # nothing converted, nothing loaded


def test_the_cache_root_as_a_link_is_refused(cache, tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root-link").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("KVDRIFT_CACHE", str(tmp_path / "root-link"))
    with pytest.raises(ValueError, match="is a symbolic link"):
        lm_model.smollm2_path()
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_link_inside_the_converted_folder_is_refused(cache, tmp_path):
    folder = lm_model.smollm2_path()
    (tmp_path / "planted.safetensors").write_bytes(b"weights" * 100)  # same bytes, a link
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(tmp_path / "planted.safetensors")
    with pytest.raises(ValueError, match=_refusal(
            folder, "'model.safetensors' is not a regular file (a link, a folder or a device)")):
        lm_model.smollm2_path()


def test_a_changed_file_is_refused_even_after_a_verified_load(cache):
    folder = lm_model.smollm2_path()  # verified once, remembered
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.write(b"W")  # one byte, same size
    with pytest.raises(ValueError, match=_refusal(
            folder, "'model.safetensors' does not match the SHA-256 recorded when it was "
                    "converted (changed since)")):
        lm_model.smollm2_path()
    with pytest.raises(ValueError, match="'model.safetensors' does not match the SHA-256"):
        lm_model.load_model()  # the weights are checked as they are read to load
    assert lm_model.text_config().model_type == "llama"  # a config alone reads no weights


def test_an_extra_a_missing_file_or_no_manifest_is_refused(cache):
    folder = lm_model.smollm2_path()
    (folder / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(ValueError, match=_refusal(
            folder, "'model.safetensors.index.json' is not a file the conversion wrote")):
        lm_model.smollm2_path()
    (folder / "model.safetensors.index.json").unlink()
    (folder / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match=_refusal(
            folder, "'tokenizer_config.json', which the conversion wrote, is missing")):
        lm_model.smollm2_path()
    _fake_convert(folder)
    lm_model.smollm2_path()
    (folder / converted_cache.MANIFEST).unlink()
    with pytest.raises(ValueError, match=_refusal(
            folder, f"it has no {converted_cache.MANIFEST} (converted by an older kvdrift, "
                    f"or not by kvdrift)")):
        lm_model.smollm2_path()


def _key(tmp_path: Path) -> bytes:
    return (tmp_path / "cache" / converted_cache.KEY_FILE).read_bytes()


def test_a_folder_converted_from_another_gguf_is_refused(cache, tmp_path):
    folder = lm_model.smollm2_path()
    data = json.loads((folder / converted_cache.MANIFEST).read_text())
    data["source_sha256"] = "0" * 64
    data["hmac"] = converted_cache.seal(data, _key(tmp_path))  # as kvdrift would have sealed it
    (folder / converted_cache.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="it was converted from another GGUF file "
                                         r"\(SHA-256 000000000000, the installed one is"):
        lm_model.smollm2_path()


def test_a_folder_others_can_write_is_refused(cache):
    folder = lm_model.smollm2_path()
    os.chmod(folder, 0o777)
    with pytest.raises(ValueError, match=_refusal(
            folder, "it is not a private folder of this user (owned by another user, or "
                    "writable by others)")):
        lm_model.smollm2_path()


def test_a_cache_of_an_older_kvdrift_is_converted_again_beside_it(cache, tmp_path):
    old = tmp_path / "cache" / SMOLLM2_CACHE_NAME  # no manifest, the old name
    old.mkdir(parents=True)
    _fake_convert(old)
    folder = lm_model.smollm2_path()
    assert folder != old and len(cache) == 1
    assert (folder / converted_cache.MANIFEST).is_file()


def test_a_manifest_recomputed_without_the_key_is_refused(cache, tmp_path):
    """A changed config.json under a manifest recomputed over the folder's files (the digests
    all match) is refused: the manifest vouches for nothing unless kvdrift sealed it."""
    folder = lm_model.smollm2_path()
    (folder / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    with pytest.raises(ValueError, match=_refusal(
            folder, "'config.json' does not match the SHA-256 recorded when it was converted "
                    "(changed since)")):
        lm_model.text_config()
    (folder / converted_cache.MANIFEST).unlink()
    converted_cache.write_manifest(folder, lm_model.smollm2_gguf_digest(), b"k" * 32)  # forged
    refusal = _refusal(folder, f"its {converted_cache.MANIFEST} was not written by kvdrift for "
                               f"this user (its seal does not match the key in "
                               f"{converted_cache.KEY_FILE})")
    with pytest.raises(ValueError, match=refusal):
        lm_model.text_config()
    data = json.loads((folder / converted_cache.MANIFEST).read_text())
    del data["hmac"]  # the manifest of an older kvdrift's format, or none sealed
    (folder / converted_cache.MANIFEST).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="is not a manifest kvdrift wrote"):
        lm_model.smollm2_path()


def test_a_folder_swapped_in_after_the_check_is_never_loaded(cache, tmp_path, monkeypatch):
    """The folder is checked, then replaced by a look-alike (its own config, the old manifest
    copied) before transformers reads it: what loads is the bytes checked."""
    import shutil

    from kvdrift.lm.loading import from_cache

    folder = lm_model.smollm2_path()
    decoy = tmp_path / "decoy"
    shutil.copytree(folder, decoy)
    (decoy / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    real_config = from_cache.config

    def swap_then_load(opened):
        os.rename(folder, tmp_path / "moved-away")
        os.rename(decoy, folder)
        return real_config(opened)

    monkeypatch.setattr(from_cache, "config", swap_then_load)
    config = lm_model.text_config()
    assert config.num_hidden_layers == 32  # LlamaConfig's default: the checked {"model_type"}
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 2
    monkeypatch.setattr(from_cache, "config", real_config)
    with pytest.raises(ValueError, match="'config.json' does not match the SHA-256"):
        lm_model.text_config()  # the decoy itself, opened afresh, is refused


@pytest.mark.parametrize(("mode", "where"), [(0o777, "root"), (0o775, "root"),
                                             (0o757, "parent"), (0o1777, None)])
def test_a_cache_root_others_can_write_is_refused(cache, tmp_path, monkeypatch, mode, where):
    parent = tmp_path / "shared"
    root = parent / "cache"
    root.mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("KVDRIFT_CACHE", str(root))
    loose = root if where == "root" else parent
    os.chmod(parent, 0o755)
    os.chmod(loose, mode)
    if where is None:  # sticky (as /tmp): others cannot rename what is ours
        assert lm_model.smollm2_path().parent == root
        return
    whom = "its group or others" if where == "root" else "others"
    message = (f"cache folder {root}: {loose} is writable by {whom} (mode {mode:04o}, no sticky "
               f"bit), so anyone could replace the converted weights; make it private (chmod "
               f"go-w {loose}) or set KVDRIFT_CACHE to a private folder")
    with pytest.raises(ValueError, match=whole(message)):
        lm_model.smollm2_path()
    with pytest.raises(ValueError, match=whole(message)):
        lm_model.load_model()
    assert cache == []  # refused before any conversion


def test_a_key_file_others_can_read_is_refused(cache, tmp_path):
    lm_model.smollm2_path()
    key = tmp_path / "cache" / converted_cache.KEY_FILE
    os.chmod(key, 0o644)
    with pytest.raises(ValueError, match=f"cache key {key} is not a private file of this user"):
        lm_model.smollm2_path()


def test_weights_that_are_not_the_pinned_conversion_are_refused(monkeypatch, tmp_path):
    import torch

    from kvdrift.lm.loading import pins

    monkeypatch.setattr(pins, "EMBEDDED_WEIGHTS", {"g" * 64: {"float32": "a" * 64}})
    pins.check_embedded("a" * 64, torch.float32, "g" * 64, tmp_path)  # the pinned weights
    pins.check_embedded("b" * 64, torch.float16, "g" * 64, tmp_path)  # no pin for float16
    pins.check_embedded("b" * 64, torch.float32, "h" * 64, tmp_path)  # another GGUF: the key
    with pytest.raises(ValueError, match=whole(
            f"converted-weights cache {tmp_path}: its weights are not the embedded model's "
            f"(SHA-256 bbbbbbbbbbbb in torch.float32, kvdrift pins aaaaaaaaaaaa for this GGUF); "
            f"delete {tmp_path} to convert the model again")):
        pins.check_embedded("b" * 64, torch.float32, "g" * 64, tmp_path)


def test_the_embedded_gguf_s_conversion_is_pinned_in_every_dtype():
    from kvdrift.lm.loading import pins

    pinned = pins.EMBEDDED_WEIGHTS[lm_model.smollm2_gguf_digest()]
    assert sorted(pinned) == sorted(lm_model.DTYPES)
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in pinned.values())
    assert len(set(pinned.values())) == 3


def test_weights_are_viewed_in_the_checked_bytes_as_safetensors_reads_them(tmp_path):
    import torch
    from safetensors.torch import load, save

    from kvdrift.lm.loading.from_cache import tensors

    torch.manual_seed(0)
    state = {"w": torch.randn(3, 5), "h": torch.randn(4).to(torch.bfloat16),
             "i": torch.arange(6, dtype=torch.int64).reshape(2, 3), "e": torch.zeros(0, 2),
             "b": torch.tensor([True, False])}
    data = bytearray(save(state, metadata={"format": "pt"}))
    viewed = tensors(data, "model.safetensors")
    expected = load(bytes(data))
    assert sorted(viewed) == sorted(expected)
    for name, tensor in expected.items():
        assert viewed[name].dtype == tensor.dtype and torch.equal(viewed[name], tensor)
    viewed["w"][0, 0] = 7.0  # a view of the buffer, not a copy
    assert load(bytes(data))["w"][0, 0] == 7.0
    header = int.from_bytes(data[:8], "little")
    broken = data[:8 + header] + data[8 + header:-4]  # the last tensor's bytes cut short
    with pytest.raises(ValueError, match="^x: not a safetensors file kvdrift can read"):
        tensors(broken, "x")


def test_a_loose_folder_above_the_root_behind_a_link_is_refused(cache, tmp_path, monkeypatch):
    """The folders checked are the real ones above the root, not the path as typed."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.chmod(real, 0o777)
    (tmp_path / "typed").symlink_to(real)
    monkeypatch.setenv("KVDRIFT_CACHE", str(tmp_path / "typed" / "cache"))
    with pytest.raises(ValueError, match=f"^cache folder {tmp_path}/typed/cache: {real} is "
                                         f"writable by others \\(mode 0777, no sticky bit\\)"):
        lm_model.smollm2_path()
    assert cache == [] and list(real.iterdir()) == []
