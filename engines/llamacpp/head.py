"""Only the logits an answer can read: the model's body in llama.cpp, its output layer here.

An answer-tree node needs the logits of a few answer tokens, but a decode computes all of the
output layer's rows (Gemma 3 270M: 262,144 × 640, more than half of a one-token decode). A
llama.cpp context made with ``HiddenStates.params`` stops each decode at the last layer's
normalized hidden state (``result_norm``), which its eval callback keeps; ``OutputHead`` then
computes the rows asked for from the model file's own output matrix, as llama.cpp's CPU kernels
compute them: the hidden state quantized to Q8_0 blocks, integer dot products with the Q8_0
weights, scaled by both blocks' scales. Measured against llama.cpp's own logits on Gemma 3 270M:
within 3e-6 (logits of magnitude ~20), float summation order only
(tests/engines/test_shared_streams.py); a float dot product of the dequantized weights would be
off by ~0.1. Only a model whose output matrix is Q8_0 and which caps no logits takes this path
(``OutputHead.load`` returns None otherwise), and a context checks its first row against the
full logits before it trusts the head (``HiddenStates.verify``).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import struct
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from engines.gguf_header import read_header

__all__ = ["HeadRow", "HiddenStates", "OutputHead"]

#: ggml's type number of Q8_0 blocks (a float16 scale, 32 signed bytes).
_Q8_0 = 8
_Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
#: A tolerance far above the head's float noise (3e-6) and far below a wrong matrix's errors (~1).
TOLERANCE = 1e-3


class OutputHead:
    """A model's output matrix (Q8_0 rows, memory-mapped from its GGUF file) and the logits of
    chosen tokens from a hidden state, computed as llama.cpp computes them."""

    def __init__(self, blocks: np.ndarray, n_embd: int):
        self.blocks = blocks  # (n_vocab, n_embd // 32) Q8_0 blocks
        self.n_embd = n_embd
        self._rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def load(cls, path: str | Path, n_embd: int) -> OutputHead | None:
        """The head of the GGUF file at ``path``, or None where this path cannot follow llama.cpp
        exactly: an output matrix that is not Q8_0, a final logit softcap, a file it cannot read."""
        try:
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            header = read_header(mm)
        except (OSError, ValueError, struct.error):
            return None
        if any(key.endswith(".final_logit_softcapping") and value for key, value in header.metadata.items()):
            return None
        # llama.cpp's choice: the output matrix, or the token embeddings where it is tied.
        found = header.tensors.get("output.weight") or header.tensors.get("token_embd.weight")
        if found is None:
            return None
        dims, kind, offset = found
        if kind != _Q8_0 or len(dims) != 2 or dims[0] != n_embd or n_embd % 32 or ggml_library() is None:
            return None
        blocks = np.frombuffer(mm, dtype=_Q8_0_BLOCK, count=dims[0] * dims[1] // 32, offset=header.data + offset)
        return cls(blocks.reshape(dims[1], n_embd // 32), n_embd)

    def logits(self, hidden: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        """The logits of ``tokens`` after the hidden state ``hidden`` (float32, as llama.cpp's)."""
        key = tuple(int(t) for t in tokens)
        if key not in self._rows:
            rows = self.blocks[list(key)]
            self._rows[key] = (rows["qs"].astype(np.int32), rows["d"].astype(np.float32))
        qs, scales = self._rows[key]
        q, d = _quantize_q8_0(hidden)
        sums = np.einsum("tbk,bk->tb", qs, q)  # each block's integer dot product (exact)
        return (sums.astype(np.float32) * (scales * d)).sum(axis=1, dtype=np.float32)


def _quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``quantize_row_q8_0`` (x86 kernels): per block of 32, the scale max|x| / 127 kept
    as float16, and x × 127 / max|x| rounded to the nearest integer (ties to even)."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1)
    inverse = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    q = np.rint(blocks * inverse[:, None]).astype(np.int32)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    return q, d


class HeadRow:
    """One decoded row's logits, computed for the tokens asked (``row[tokens]``)."""

    __slots__ = ("head", "hidden")

    def __init__(self, head: OutputHead, hidden: np.ndarray):
        self.head, self.hidden = head, hidden

    def __getitem__(self, tokens: Sequence[int]) -> np.ndarray:
        return self.head.logits(self.hidden, tokens)


class HiddenStates:
    """The eval callback that stops a llama.cpp decode at the last hidden state and keeps it.

    ``params(p)`` sets it on context parameters; after each ``llama_decode``, ``take()`` gives the
    hidden states of the rows that asked for output, in batch order (llama.cpp splits a batch of
    one row per stream, in increasing stream order, into ubatches in that same order)."""

    NAME = b"result_norm"

    def __init__(self, head: OutputHead):
        self.head = head
        lib = ggml_library()
        assert lib is not None, "OutputHead.load gives no head without ggml's library"
        name, nbytes, get = lib.ggml_get_name, lib.ggml_nbytes, lib.ggml_backend_tensor_get
        name.restype, name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        nbytes.restype, nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
        get.restype, get.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        self._parts: list[np.ndarray] = []
        #: None until ``verify`` compared the head with llama.cpp's full logits; until it is True,
        #: every decode goes on to the output layer.
        self.trusted: bool | None = None
        target = self.NAME

        def callback(tensor: int, ask: bool, _: Any) -> bool:
            if ask:
                return name(tensor) == target
            size = nbytes(tensor)
            part = np.empty(size // 4, np.float32)
            get(tensor, part.ctypes.data, 0, size)
            self._parts.append(part)
            return self.full  # False: the rest of the graph (the output layer) is not computed

        import llama_cpp

        self._callback = llama_cpp.ggml_backend_sched_eval_callback(callback)  # kept: llama.cpp holds only its address

    @property
    def full(self) -> bool:
        """Whether a decode computes the full logits too: until the head is checked and trusted."""
        return self.trusted is not True

    def params(self, params: Any) -> None:
        params.cb_eval = self._callback

    def take(self) -> list[HeadRow]:
        """The last decode's output rows' hidden states, as rows of logits."""
        parts, self._parts = self._parts, []
        hidden = np.concatenate(parts).reshape(-1, self.head.n_embd) if parts else np.empty((0, self.head.n_embd), np.float32)
        return [HeadRow(self.head, h) for h in hidden]

    def verify(self, row: HeadRow, full: np.ndarray, tokens: Sequence[int]) -> bool:
        """Trust the head if it gives llama.cpp's ``full`` logits for ``tokens`` (within ``TOLERANCE``)."""
        self.trusted = bool(np.abs(row[tokens] - full[list(tokens)]).max() <= TOLERANCE)
        return self.trusted


@functools.cache
def ggml_library() -> Any:
    """ggml's base library as llama-cpp-python ships it (for ``ggml_get_name`` and
    ``ggml_backend_tensor_get``), or None where it is not found."""
    import llama_cpp

    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        path = Path(llama_cpp.__file__).parent / "lib" / name
        if path.exists():
            try:
                return ctypes.CDLL(str(path))
            except OSError:
                continue
    return None
