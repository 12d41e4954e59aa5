"""Seeds derived from the experiment seed, vectorised over agents.

Every random choice in a run (persona sampling, sampling seeds, simulated decisions)
draws from a seed derived from (experiment seed, labels…, agent id) with splitmix64,
so results do not depend on how agents were sharded, on which worker, or on restarts.
"""

from __future__ import annotations

import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64, copy=True) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def label_key(seed: int, *labels: object) -> int:
    """A 64-bit key from the run seed and any labels (arm, round, phase…)."""
    blob = "\x1f".join([str(seed), *map(str, labels)]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little")


def agent_seeds(seed: int, agent_id: np.ndarray, *labels: object) -> np.ndarray:
    """One uint64 per agent, a pure function of (seed, labels, agent id)."""
    key = np.uint64(label_key(seed, *labels))
    with np.errstate(over="ignore"):
        return splitmix64(np.asarray(agent_id, dtype=np.uint64) * _GOLDEN ^ key)


def sampling_seeds(seed: int, agent_id: np.ndarray, round_: int) -> np.ndarray:
    """Each agent's sampling seed in a round, as the engines take it (32 bits, int64): a pure
    function of (seed, round, agent id), the same in every arm (paired arms)."""
    return (agent_seeds(seed, agent_id, "sample", round_) & np.uint64(0xFFFFFFFF)).astype(np.int64)


def uniform01(bits: np.ndarray) -> np.ndarray:
    """Map uint64 bits to floats in [0, 1) using the top 53 bits."""
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
