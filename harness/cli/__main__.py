"""``python -m harness.cli``: the ``pdconform`` command."""

import sys

from harness.cli import main

sys.exit(main())
