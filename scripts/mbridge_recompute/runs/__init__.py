"""Running things: the matched harness sweep, its launcher and parser check, the recompute test runner."""
