"""`python3 -m programs.guard ...` (and the archive's own __main__, see planning/guard.py)."""

import sys

from programs.guard.main import main

sys.exit(main())
