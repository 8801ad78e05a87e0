"""Feature and column names that the data side writes and the model side reads.

LeRobot's feature names for the proprio state and the action, and the columns a mixture adds
to every sample (`data/embodiment.py` fills them, the processors pass them to the model).
"""

from __future__ import annotations

STATE, ACTION = "observation.state", "action"  # LeRobot's feature names
EMBODIMENT = "embodiment"  # column: the dataset's index in the mixture
ACTION_DIM_MASK = "action_dim_mask"  # column (N, A): the robot's own action dimensions
IMAGE_MASK = "image_mask/"  # column prefix (N,) per camera: the robot has this camera
