"""Warehouse: the DuckDB schema and migrations, pandera schemas, the store, SQL views.

Knows nothing about Prefect or Ray: Arrow and polars in, DuckDB files out.
"""
