"""The facts the tools share: the card (labels, constraints, evidence per release) and release resolution."""
