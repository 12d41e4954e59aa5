"""The vLLM path on an NVIDIA GPU: one engine per GPU in a Ray actor, a real round.

Run on a GPU machine with the GPU extra (see benchmarks/gpu.sh):
    uv sync --extra vllm && uv run --extra vllm pytest tests/gpu -m gpu
Skipped where there is no NVIDIA GPU.
"""

from __future__ import annotations

import shutil

import pytest

from tests.support.sql import q


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None:  # don't import torch on CPU-only machines
        return False
    import torch

    return torch.cuda.is_available()


pytestmark = [pytest.mark.gpu, pytest.mark.vllm, pytest.mark.skipif(not _has_cuda(), reason="needs an NVIDIA GPU and `uv sync --extra vllm`")]

N = 512
CONFIG = {
    "name": "vllm-gpu-test",
    "seed": 5,
    "population": {"spec": "education.yaml", "size": N},
    "game": {"ratio": "2/3", "rounds": 2},
    "arms": {
        "engines": [{"kind": "vllm", "model": "gemma-3-270m", "num_gpus": 1, "gpu_memory_utilization": 0.5}],
        "prompts": ["basic", "cot"],
        "max_reasoning_tokens": 128,
    },
    "workers": {"actors": 1, "shard_size": 256},
}


@pytest.fixture(scope="module")
def gpu_db(tmp_path_factory, prefect_api, local_ray):
    from flows.experiment import experiment

    assert local_ray.cluster_resources().get("GPU", 0) >= 1, "Ray sees no GPU"
    path = tmp_path_factory.mktemp("gpu") / "gpu.duckdb"
    return path, experiment(CONFIG, db=str(path))



def test_rounds_on_a_gpu_store_every_answer_valid(gpu_db):
    path, summary = gpu_db
    assert summary.rows_written == N * 2 * 2
    assert q(path, "select count(*) filter (where valid), count(*) from guesses") == [(N * 4, N * 4)]
    assert q(path, "select distinct engine, model from guesses") == [("vllm", "gemma-3-270m")]
    assert q(path, f"select count(*) from rounds where n_valid = {N}") == [(4,)]


def test_the_engine_ran_on_cuda():
    import ray

    from engines.vllm import VllmSpec

    @ray.remote(num_gpus=1)
    def platform() -> tuple[bool, list]:
        from vllm.platforms import current_platform

        return current_platform.is_cuda(), ray.get_gpu_ids()

    assert VllmSpec(num_gpus=1).on_cuda
    is_cuda, gpus = ray.get(platform.remote())
    assert is_cuda and len(gpus) == 1
