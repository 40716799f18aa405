"""``python -m harmony.cli ...``: the ``harmony`` command."""
import sys

from harmony.cli import main

sys.exit(main())
