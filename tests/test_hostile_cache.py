"""The converted-weights cache is trusted only as far as its recorded digests: a planted link,
a foreign folder, a changed, extra or missing file, or a folder converted from another GGUF is
refused in one line before anything is loaded (the conversion is faked: no weights)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kvdrift.lm.loading import converted_cache
from kvdrift.lm.loading import model as lm_model
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
    monkeypatch.setattr(converted_cache, "_verified", {})
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
    with pytest.raises(ValueError, match="does not match the SHA-256"):
        lm_model.text_config()


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


def test_a_folder_converted_from_another_gguf_is_refused(cache, monkeypatch):
    folder = lm_model.smollm2_path()
    data = json.loads((folder / converted_cache.MANIFEST).read_text())
    data["source_sha256"] = "0" * 64
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
    old = tmp_path / "cache" / lm_model.SMOLLM2_CACHE_NAME  # no manifest, the old name
    old.mkdir(parents=True)
    _fake_convert(old)
    folder = lm_model.smollm2_path()
    assert folder != old and len(cache) == 1
    assert (folder / converted_cache.MANIFEST).is_file()


@pytest.mark.slow
def test_the_real_cache_s_manifest_catches_a_changed_config(tmp_path, monkeypatch):
    """The embedded model's own conversion: its manifest lists every file; a copy of its
    folder with a changed config.json (weights left out: a placeholder) is refused."""
    import shutil

    real = lm_model.smollm2_path()  # converted (and verified) once per machine
    monkeypatch.setenv("KVDRIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(converted_cache, "_verified", {})
    folder = lm_model.smollm2_cache_dir()
    folder.mkdir(parents=True, mode=0o700)
    listed = json.loads((real / converted_cache.MANIFEST).read_text())["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(listed)
    for name in [*listed, converted_cache.MANIFEST]:
        if name != "model.safetensors":
            shutil.copy(real / name, folder / name)
    (folder / "model.safetensors").write_bytes(b"placeholder")
    with pytest.raises(ValueError, match="'model.safetensors' does not match the SHA-256"):
        lm_model.smollm2_path()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 2}))
    with pytest.raises(ValueError, match="'config.json' does not match the SHA-256"):
        lm_model.load_model()
