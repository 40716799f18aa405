from harmony.cli import master_main

master_main()
