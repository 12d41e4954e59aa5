"""What a ``keynes`` command runs beside its work: the settings every process gives Prefect and
Ray (``settings``), no orphans (``processes``: records, marks and the watchdog) and Prefect's
temporary API, started early and kept alive (``temporary_api``).
"""
