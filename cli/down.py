"""``keynes down``: stop the warm stack ``keynes up`` started."""

from __future__ import annotations

from cli.common import console


def down() -> None:
    """Stop the warm stack `keynes up` started (its Ray, its Prefect server, and every process
    they started), even if a part of it died; remove its record.

    Example: keynes down
    """
    from cli.runtime.stack import down as stack_down
    from cli.runtime.stack import read, record_path

    stack = read()
    lines = stack_down()
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)
    if stack is None and not lines:
        console.print(f"no warm stack is up (no record in {record_path()})", highlight=False, soft_wrap=True)
    else:
        console.print("warm stack down", highlight=False)
