"""The domain core: game rules and outcomes, seeds, quotas, persona columns, level-k hierarchies.

Plain Python (numpy, polars, pydantic) with no Prefect, Ray or DuckDB imports, so that
config validation, the stages and the simulated engine share one definition of each.
"""
