"""Flows: the Prefect flow ``experiment``, the experiment config models and the ``keynes`` CLI.

The only layer that knows about orchestration and the command line; it composes
domain types from ``tasks``, ``populations`` and ``prompts`` and knows nothing of
how engines or storage work inside.
"""
