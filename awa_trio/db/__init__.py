"""asyncpg, driven from Trio through trio-asyncio.

This package is the only code that touches asyncpg or asyncio. It owns one
trio-asyncio loop and one pool of asyncpg connections per :class:`Database`.
Each module does one job:

* :mod:`.errors`: the :class:`DatabaseError` types (they keep the SQLSTATE)
  and :func:`translate_error`, the one mapping of driver errors onto them;
* :mod:`.bridge`: how a driver call crosses from Trio to asyncio and back,
  cancellation included, and the asyncio loop's hooks;
* :mod:`.connection`: one connection: opening it, statements, transactions;
* :mod:`.pool`: the pool, on the Trio side;
* :mod:`.database`: :class:`Database` and :func:`open_database`;
* :mod:`.lock_holders`: naming the table a lock timeout waited for.

Callers import from ``awa_trio.db``; the names below are its interface.
"""

from .bridge import _drive, _run_wakes_inline
from .connection import (
    APPLICATION_NAME,
    CLEANUP_TIMEOUT,
    STARTUP_PARAMETERS,
    Connection,
    rows_affected,
)
from .database import (
    DEFAULT_CONNECT_TIMEOUT,
    PID_SQL,
    Database,
    milliseconds,
    open_database,
)
from .errors import (
    CLOSED_MESSAGE,
    LOCK_NOT_AVAILABLE,
    UNIQUE_VIOLATION,
    ConnectionLost,
    DatabaseClosed,
    DatabaseError,
    InvalidDatabaseURL,
    LockTimeout,
    QueryError,
    UniqueViolation,
    describe_error,
    is_row_data_error,
    row_level_refusal,
    sole_exception,
    translate_error,
)
from .lock_holders import EXCLUSIVE_HOLDERS_SQL, find_lock_holder
from .pool import IDLE_CONNECTION_LIFETIME, _Pool

__all__ = [
    "APPLICATION_NAME",
    "CLEANUP_TIMEOUT",
    "CLOSED_MESSAGE",
    "DEFAULT_CONNECT_TIMEOUT",
    "EXCLUSIVE_HOLDERS_SQL",
    "IDLE_CONNECTION_LIFETIME",
    "LOCK_NOT_AVAILABLE",
    "PID_SQL",
    "STARTUP_PARAMETERS",
    "UNIQUE_VIOLATION",
    "Connection",
    "ConnectionLost",
    "Database",
    "DatabaseClosed",
    "DatabaseError",
    "InvalidDatabaseURL",
    "LockTimeout",
    "QueryError",
    "UniqueViolation",
    "_Pool",
    "_drive",
    "_run_wakes_inline",
    "describe_error",
    "find_lock_holder",
    "is_row_data_error",
    "milliseconds",
    "open_database",
    "row_level_refusal",
    "rows_affected",
    "sole_exception",
    "translate_error",
]

# Tracebacks and reprs name a class where callers import it from
# (``awa_trio.db.QueryError``: the README shows that line), not the module
# that happens to define it.
for _public in (
    Connection,
    ConnectionLost,
    Database,
    DatabaseClosed,
    DatabaseError,
    InvalidDatabaseURL,
    LockTimeout,
    QueryError,
    UniqueViolation,
):
    _public.__module__ = __name__
del _public
