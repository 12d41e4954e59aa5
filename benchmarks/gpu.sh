#!/usr/bin/env bash
# The vLLM path on an NVIDIA GPU machine: install the GPU extra, prepare the bundled model, run the
# GPU tests, the throughput benchmark, and an experiment through the CLI (one vLLM engine per GPU).
#
#   bash benchmarks/gpu.sh                 # from the repository root of a fresh checkout
#   ACTORS=4 bash benchmarks/gpu.sh        # a machine with 4 GPUs: one engine (actor) per GPU
set -euo pipefail
cd "$(dirname "$0")/.."

ACTORS="${ACTORS:-1}"
DB="${DB:-/tmp/keynes-vllm-gpu.duckdb}"
python3 -m pip install --quiet --disable-pip-version-check uv
# Every `uv run` names the extra: without it uv would sync the environment back to the default one.
uv sync --extra vllm
nvidia-smi --query-gpu=name,memory.total --format=csv
uv run --extra vllm keynes models prepare gemma-3-270m
uv run --extra vllm pytest tests/gpu -m gpu -q
uv run --extra vllm python benchmarks/vllm_throughput.py --num-gpus 1 --prompts 5000
uv run --extra vllm keynes run experiments/vllm_gpu.yaml --db "$DB" --set workers.actors="$ACTORS"
uv run --extra vllm keynes sql --db "$DB" \
  "select r.prompt_mode, o.round, o.n, o.n_valid, round(o.mean, 2) as mean, round(o.seconds, 1) as seconds
   from rounds o join runs r using (run_id) order by r.arm, o.round"
