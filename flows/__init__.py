"""Flows: the Prefect flow ``experiment``, its deployments and schedules, and what the Prefect UI
shows of a run (artifacts, failures, interrupted runs marked).

Prefect only: the experiment's design lives in ``design``, the stages in ``tasks``, the command
line in ``cli``. The flow calls the stages in order and reaches the warehouse only through the
store stage (tests/test_layering.py).
"""
