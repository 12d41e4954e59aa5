"""Tasks: one module per stage (personas, play, environment, store), the Ray worker and
the inference engines (``tasks/engines``).

``environment`` is plain Python; Prefect appears only in the stage task decorators and
Ray only in ``play``. Nothing here imports ``flows``.
"""
