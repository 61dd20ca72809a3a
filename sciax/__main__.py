"""`python -m sciax ...`: the `sciax` command (`sciax.app.cli`)."""

import sys

from .app.cli import main

sys.exit(main())
