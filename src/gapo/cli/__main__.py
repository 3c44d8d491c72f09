"""``python -m gapo.cli``: the ``gapo`` command line."""

import sys

from gapo.cli import main

sys.exit(main())
