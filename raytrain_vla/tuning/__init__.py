"""Ray Tune sweeps over config keys: space files and the sweep driver."""
