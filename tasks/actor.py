"""The Ray actor that owns one engine and plays shards with it.

Kept apart from ``tasks.play`` on purpose: Ray imports an actor's module in every worker
process, and this one imports neither Prefect nor the warehouse, so an actor starts in
about a second instead of several (measured: importing ``tasks.play`` costs ~4x more).
"""

from __future__ import annotations

import os
from typing import Any

import ray

from tasks.engines import CompletionBatch, EngineSpec, RequestBatch
from tasks.worker import ShardJob, ShardPlayer, ShardResult


@ray.remote
class AgentWorker:
    """A Ray actor that owns one engine and plays shards with it."""

    def __init__(self, spec: EngineSpec):
        self.player = ShardPlayer(spec)
        self.node = ray.get_runtime_context().get_node_id()

    def play(self, job: ShardJob) -> ShardResult:
        return self.player.play(job, node=self.node)

    def complete(self, batch: RequestBatch) -> CompletionBatch:
        """Completions from this actor's engine outside a game (e.g. persona backstories)."""
        return self.player.engine.generate(batch)

    def where(self) -> dict[str, Any]:
        return {"node": self.node, "worker": self.player.worker, "pid": os.getpid()}
