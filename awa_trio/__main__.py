"""``python -m awa_trio``.

SIGINT and SIGTERM are only recorded from the first line on, before the
heavy imports, so that a stop request in the first moments ends the process
cleanly with exit 0 (``startup_stop`` says why they are not raised); each
command then takes over the signals (``cli.main``).
"""

import sys

from . import startup_stop

startup_stop.defer()

from .cli import main  # noqa: E402  (after the signals are deferred)

sys.exit(main())
