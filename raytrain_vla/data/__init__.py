"""Data: the sample plan, the dataset view, the Ray Data pipeline, and on-disk formats."""
