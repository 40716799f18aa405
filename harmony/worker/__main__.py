from harmony.cli import worker_main

worker_main()
