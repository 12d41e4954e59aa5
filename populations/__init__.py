"""Populations: demographic specs (YAML), the persona sampler, names and the plain parts
of the backstory pipeline (cache keys, cleaning a model's continuation).

Plain Python (numpy, polars, pydantic, Faker's name lists): knows nothing about Prefect
or Ray. Only the backstory settings name an engine (``BackstoryConfig.engine``, an engine
spec): writing the backstories is the personas stage's (``tasks/personas.py``).
"""
