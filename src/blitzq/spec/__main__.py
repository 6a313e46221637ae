"""``python -m blitzq.spec``: write (or ``--check``) the machine-readable spec."""

import sys

from . import main

sys.exit(main())
