"""``python -m podracer``: the ``podracer`` command."""

import sys

from podracer.cli.main import main

sys.exit(main())
