"""Flows: the Prefect flow ``experiment``, the experiment config (models and loading),
deployments, what the Prefect UI shows, and the ``keynes`` CLI.

The only layer that knows about the command line; it calls the stages in ``tasks`` and
composes domain types from ``core``, ``engines``, ``populations`` and ``prompts``.
"""
