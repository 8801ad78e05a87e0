"""Model families behind one contract (`base.py`), looked up by `model.type` (`registry.py`)."""
