"""`python -m draftlab.cli`: the same entry point as the `draftlab` command."""

import sys

from draftlab.cli import main

sys.exit(main())
