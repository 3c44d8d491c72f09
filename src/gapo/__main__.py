"""``python -m gapo``: the same command line as the ``gapo`` console script."""

import sys

from gapo.cli import main

sys.exit(main())
