"""``python -m assistant.cli``: the ``diffu`` command."""

import sys

from assistant.cli.main import main

sys.exit(main())
