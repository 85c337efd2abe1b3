from mbridge_recompute.cli import main

main()
