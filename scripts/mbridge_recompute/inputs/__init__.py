"""Inputs -> Workload: workload files, Bridge dumps, overrides, the model catalog, HF configs."""
