"""Tasks: the stages of the flow, one module each (personas, play, environment, store,
report), with their Prefect tasks and retry/caching policies on the decorators.

Beside them, the workers: ``pool`` (the Ray actors that own the engines, used by play and by
the personas stage's backstories), ``actor`` (the Ray actor itself: no Prefect there, so
actors start fast) and ``limits`` (a hosted API's request and token limits, shared by every
actor of an engine). Stage logic lives in ``core``, ``design`` and the domain packages;
nothing here imports ``flows`` or ``cli`` (tests/test_layering.py).
"""
