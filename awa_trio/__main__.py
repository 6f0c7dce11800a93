"""``python -m awa_trio``.

SIGTERM is turned into KeyboardInterrupt first, before the heavy imports, so
that a stop request in the first moments ends the process as Ctrl-C does,
cleanly and with exit 0; each command then sets its own signal handling
(``cli.main``).
"""

import signal
import sys

signal.signal(signal.SIGTERM, signal.default_int_handler)
try:
    from .cli import main
except KeyboardInterrupt:
    sys.exit(0)

sys.exit(main())
