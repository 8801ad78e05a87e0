"""Wall-OSS (LeRobot 0.6.1's `wall_x`, flow mode) under `model.type=wall_x`."""
