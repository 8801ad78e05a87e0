"""flow_vla: the built-in pi0-style VLA trained from scratch (family object in `family.py`)."""
