"""Design: what an experiment is, before anything runs.

The config models (``config``) and their loading with ``--set`` overrides (``loading``), an arm
and its checks (``arms``), each arm's prompt format (``prompting``), what an agent sees in a
round (``seen``), the token budget (``budget``) and ``keynes plan``'s estimate (``plan``).
Between the domain packages (core, prompts, engines, populations) and the stages (tasks):
imports neither Prefect, nor Ray, nor the warehouse.
"""
