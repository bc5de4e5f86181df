"""``python -m assistant``: the same as the ``diffu`` command."""

import sys

from assistant.cli.main import main

sys.exit(main())
