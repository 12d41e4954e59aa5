"""Warehouse: the DuckDB schema and migrations, pandera schemas, the store, SQL views, and
read-only rows for `keynes sql` (``readonly``, which imports DuckDB alone).

Knows nothing about Prefect or Ray: Arrow and polars in, DuckDB files out.
"""
