"""Tasks: the stages of the flow, one module each (personas, play, environment, store,
report), with their Prefect tasks and retry/caching policies on the decorators.

``actor`` is the Ray actor of the play stage (no Prefect there: actors start fast).
Stage logic lives in ``core`` and the domain packages; nothing here imports ``flows``.
"""
