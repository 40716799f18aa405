import sys

from harmony.cli import worker_main

sys.exit(worker_main())
