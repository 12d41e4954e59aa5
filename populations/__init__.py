"""Populations: demographic specs (YAML) and the persona sampler.

Plain Python (numpy, polars, pydantic): knows nothing about Prefect, Ray or engines.
"""
