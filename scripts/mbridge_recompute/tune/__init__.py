"""`tune`: the closed loop from an estimate to the cheapest recompute setting that passes.

One job per module: `evidence` reads what a finished run showed, `calibrate` turns every run
into per-rank offsets for the plan, `decide` picks the next runs or stops, `state` keeps the
record (`tune.json`) that makes a tune resumable, `loop` runs the rounds, `history` renders the
record as a table and a plot.
"""
