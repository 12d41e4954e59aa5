"""Tasks: the stages of the flow, one module each (personas, play, environment, store,
report), with their Prefect tasks and retry/caching policies on the decorators.

Beside them: ``arms`` (what every stage plays: an engine × a prompt mode × a temperature ×
a rule), ``pool`` (the Ray actors that own the engines, used by play and by the personas
stage's backstories), ``actor`` (the Ray actor itself: no Prefect there, so actors start
fast), ``budget`` (the context check before an arm plays). Stage logic lives in ``core`` and
the domain packages; nothing here imports ``flows`` (tests/test_layering.py).
"""
