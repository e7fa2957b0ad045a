"""Command line: ``python -m carbon demo`` (more subcommands to come).

Run ``python -m carbon --help`` for the list.
"""

import sys

from carbon.demo import main

if __name__ == "__main__":
    sys.exit(main())
