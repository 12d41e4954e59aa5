"""The ``keynes`` command (also ``python -m cli.launch``): ``keynes run`` goes to the warm stack's
runner (cli/runtime/runner.py) when one takes it, before this process imports the CLI; every other
command runs here (cli/app.py; ``python -m cli.app`` runs every command here)."""

from __future__ import annotations

import sys


def main() -> None:
    from cli.runtime.runner import hand_off

    handed = hand_off(sys.argv[1:])
    if handed is not None:
        sys.exit(handed)
    from cli.app import main as here

    here()


if __name__ == "__main__":
    main()
