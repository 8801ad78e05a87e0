"""`python -m raytrain_vla.data ...`: the data CLI. It lives with the other entry points
(`raytrain_vla/data_cli.py`) because it checks datasets against a run's model and config, which
the data room itself never imports."""

import sys

from raytrain_vla.data_cli import main

if __name__ == "__main__":
    sys.exit(main())
