#!/usr/bin/env python3
"""`mbridge-recompute tune`; run with --help for its options."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mbridge_recompute.cli import main  # noqa: E402

main(["tune", *sys.argv[1:]])
