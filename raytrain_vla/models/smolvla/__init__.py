"""LeRobot's SmolVLA on a transformers SmolVLM backbone."""
