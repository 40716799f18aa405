"""``python -m harmony.worker.executor SPEC``: how the worker daemon starts
an executor (``daemon.py``, ``_start_executor``)."""
import sys

from harmony.worker.executor.process import main

if __name__ == "__main__":
    sys.exit(main())
