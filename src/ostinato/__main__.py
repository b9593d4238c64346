"""``python -m ostinato``: the same as the ``ostinato`` command."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
