"""The shared-context answer vocabulary, kept on disk: a later process reads Gemma's answer
tokens from ``$KEYNES_CACHE/vocab`` instead of walking its 262,144 tokens through ctypes."""

from __future__ import annotations

import json

import pytest

from engines.llamacpp import shared_context as llamacpp_shared
from engines.llamacpp.shared_context import answer_vocab, vocab_cache_path


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty keynes cache, and this process's memo emptied (as in a new process)."""
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(llamacpp_shared, "_VOCABS", {})
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def llm(gguf):
    from llama_cpp import Llama

    return Llama(model_path=str(gguf), vocab_only=True, verbose=False)


@pytest.mark.llm
def test_the_vocabulary_is_written_once_and_read_by_a_later_process(fresh, llm, gguf, monkeypatch):
    path = vocab_cache_path(gguf)
    assert path.parent == fresh / "vocab" and not path.exists()
    walked = answer_vocab(llm)
    assert path.exists() and "0" in walked.pieces and walked.eog  # Gemma's digits, and its end tokens
    assert json.loads(path.read_text()) == {"ids": list(walked.ids), "pieces": list(walked.pieces), "eog": list(walked.eog)}
    # A later process reads the file: one whose content differs shows that it is what is read.
    kept = {"ids": list(walked.ids[:3]), "pieces": list(walked.pieces[:3]), "eog": list(walked.eog)}
    path.write_text(json.dumps(kept))
    monkeypatch.setattr(llamacpp_shared, "_VOCABS", {})
    read = answer_vocab(llm)
    assert (list(read.ids), list(read.pieces), list(read.eog)) == (kept["ids"], kept["pieces"], kept["eog"])


@pytest.mark.llm
def test_a_damaged_cache_file_is_walked_again_and_replaced(fresh, llm, gguf):
    path = vocab_cache_path(gguf)
    path.parent.mkdir(parents=True)
    path.write_text('{"ids": [1, 2')  # cut short
    walked = answer_vocab(llm)
    assert len(walked.ids) > 10 and json.loads(path.read_text())["ids"] == list(walked.ids)


@pytest.mark.quick
def test_a_file_without_a_stamp_is_named_by_its_path_size_and_time(fresh, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    first = vocab_cache_path(model)
    model.write_bytes(b"GGUF" + bytes(61))  # another file at the same path
    assert vocab_cache_path(model) != first and first.parent == fresh / "vocab"
