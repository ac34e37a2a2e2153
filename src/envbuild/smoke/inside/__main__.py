"""`python -m envbuild_smoke`: the smoke test's command line."""

import sys

from .report import main

sys.exit(main())
