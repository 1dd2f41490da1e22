"""`python -m specdec.cli ...`, the same as the `specdec` command."""

import sys

from . import main

sys.exit(main())
