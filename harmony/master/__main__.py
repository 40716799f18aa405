import sys

from harmony.cli import master_main

sys.exit(master_main())
