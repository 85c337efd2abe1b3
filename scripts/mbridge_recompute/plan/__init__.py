"""Choosing a recompute setting: candidates, their memory/cost frontier, the recommendation."""
