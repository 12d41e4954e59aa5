"""The ``keynes`` command line: one module per command (or group of commands), on one typer app.

``app`` holds the app and what every command shares; ``table`` lays out the CLI's tables;
``runtime`` supervises the processes a command starts (settings given to Prefect and Ray,
the watchdog that leaves no orphan, Prefect's temporary API). The top layer: it may import
every package of keynes, and nothing imports it.
"""
