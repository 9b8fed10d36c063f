"""``python -m memplan``: the command line; Ctrl-C while it loads ends like Ctrl-C later (exit 130)."""

import sys

try:
    from .cli import main
except KeyboardInterrupt:
    sys.stderr.write("error: interrupted\n")
    sys.exit(130)

main()
