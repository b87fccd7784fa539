"""``python -m app.cli``: the ``blockpool`` command."""

import sys

from app.cli import main

sys.exit(main())
