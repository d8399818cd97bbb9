"""``python -m distfusion``: the command line."""

import sys

from distfusion.cli import main

sys.exit(main())
