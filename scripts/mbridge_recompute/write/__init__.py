"""Writing a recompute setting in the formats users paste."""
