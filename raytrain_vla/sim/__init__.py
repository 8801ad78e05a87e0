"""The demo task: its simulator and closed-loop evaluation in it (numpy only; `data/demo.py`
writes the demo dataset from it)."""
