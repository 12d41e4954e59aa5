"""What a model is, as a digest that changes when its answers may: a file's sha256, a Hugging
Face folder's files, a hub id's revision (a served model's: its server's report, ``REPORTED``).

A file's sha256 is kept in ``<cache>/sha256.json`` by resolved path, size and mtime, so a
multi-gigabyte GGUF is hashed once, not before every run; a file replaced under the same name
(another quantization) has another size or mtime and is hashed again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

from engines.models import cache_dir, sha256_file

#: What follows a served model's server and name in its identity: what the server reports of it
#: (``engines.openai.exact.served_report``).
REPORTED = "server:"
#: Files of a Hugging Face folder that decide its answers beside the weights' bytes, hashed whole.
FOLDER_CONFIGS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _digests() -> Path:
    return cache_dir().parent / "sha256.json"


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file, hashed only when its path, size or mtime is new to the cache."""
    file = Path(path).expanduser().resolve()
    info = file.stat()
    key = str(file)
    stamp = {"size": info.st_size, "mtime_ns": info.st_mtime_ns}
    cache = _digests()
    try:
        known = json.loads(cache.read_text()).get(key)
    except (OSError, ValueError):
        known = None
    if isinstance(known, dict) and {k: known.get(k) for k in stamp} == stamp and known.get("sha256"):
        return known["sha256"]
    digest = sha256_file(file)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.with_name(cache.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one writer at a time; each keeps the others' entries
        try:
            entries = json.loads(cache.read_text())
        except (OSError, ValueError):
            entries = {}
        entries[key] = {**stamp, "sha256": digest}
        partial = cache.with_name(f".{cache.name}.{os.getpid()}")
        partial.write_text(json.dumps(entries, indent=0, sort_keys=True))
        os.replace(partial, cache)
    return digest


def folder_digest(folder: str | Path) -> str:
    """A digest of a Hugging Face folder: its config and tokenizer files' text, and every other
    file's name and size (the weights are not read)."""
    root = Path(folder).expanduser().resolve()
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        name = file.relative_to(root).as_posix()
        digest.update(name.encode() + b"\0")
        digest.update(file.read_bytes() if name in FOLDER_CONFIGS else str(file.stat().st_size).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def hub_revision(repo: str) -> str:
    """``repo@<commit>``: the revision of a hub id that the local Hugging Face cache holds for
    ``main`` (what vLLM loads offline), or ``repo@main`` when none is downloaded yet."""
    home = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    ref = home / f"models--{repo.replace('/', '--')}" / "refs" / "main"
    try:
        return f"{repo}@{ref.read_text().strip()}"
    except OSError:
        return f"{repo}@main"
