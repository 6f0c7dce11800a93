"""The trio-asyncio bridge: every driver call crosses here.

A statement's driver coroutine is stepped from the calling Trio task itself
(:func:`_drive`), without an asyncio task; connecting, closing and LISTEN run
as asyncio tasks (``loop.run_aio_coroutine``). Either way a Trio cancel scope
that fires mid-query cancels what the driver waits on, and asyncpg then
sends a cancel request to the server (the query stops there too, not just
here).

Errors nobody awaits (asyncpg finishing a connection release in a task of
its own after a cancel, a connection attempt dying with the network) reach
the loop's exception handler. trio-asyncio's default handler re-raises them
into the loop's nursery, which would end the whole service over a socket
that was already lost; here they are logged instead (at debug level when
they are the echo of a lost connection that its user reports anyway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import trio
import trio_asyncio

from .errors import CLOSED_MESSAGE, ConnectionLost, DatabaseClosed, translate_error

# The whole database layer logs as awa_trio.db, the name logging configs use.
log = logging.getLogger("awa_trio.db")


async def _drive(coro: Any) -> Any:
    """Step an asyncio coroutine from the calling Trio task, as an
    ``asyncio.Task`` would, without creating one.

    A statement is one driver coroutine that waits on one protocol future at
    a time. Wrapping it in a Task (``run_aio_coroutine``) costs a task
    object and three extra trips through trio-asyncio's callback queue per
    statement; an idle leader's cost is almost all such per-statement
    overhead (README, idle cost). A Trio cancel cancels the future being
    waited on, which is what ``Task.cancel`` does: the driver sees
    ``CancelledError`` where it awaits, asks the server to cancel the query,
    and the caller gets ``trio.Cancelled``. Later waits of the same call
    (the driver's own cleanup) are not cancelled again, as in asyncio."""
    task = trio.lowlevel.current_task()
    raise_cancel: Callable[[], Any] | None = None

    aborting = False

    def wake(_future: Any) -> None:
        if aborting:  # inside abort() below: Trio wants the reschedule after it
            trio.lowlevel.current_trio_token().run_sync_soon(trio.lowlevel.reschedule, task)
        else:
            trio.lowlevel.reschedule(task)

    wake.runs_inline = True  # type: ignore[attr-defined]  # see _run_wakes_inline

    # The first step sends the statement: a task already cancelled must not
    # send it (this yields only when cancelled).
    try:
        await trio.lowlevel.checkpoint_if_cancelled()
    except BaseException:
        coro.close()
        raise
    while True:
        try:
            future = coro.send(None)
        except StopIteration as done:
            if raise_cancel is not None:
                raise_cancel()
            return done.value
        except asyncio.CancelledError:
            if raise_cancel is not None:
                raise_cancel()
            raise
        if future is None:  # a bare yield (asyncio.sleep(0))
            await trio.lowlevel.cancel_shielded_checkpoint()
            continue
        future._asyncio_future_blocking = False
        future.add_done_callback(wake)

        def abort(raise_cancel_arg: Callable[[], Any], future: Any = future) -> trio.lowlevel.Abort:
            # Runs inside Trio's cancel delivery: it must never raise, or the
            # cancel is lost for the whole scope (and a stop never stops).
            nonlocal raise_cancel, aborting
            if raise_cancel is None:
                raise_cancel = raise_cancel_arg
                aborting = True
                try:
                    future.cancel()
                except Exception as exc:
                    # The asyncio loop is closed (its open_database block has
                    # exited under us): no callback will ever settle the
                    # future, so the cancel is delivered here and now.
                    log.debug("cancelling a statement on a closed loop: %s: %s", type(exc).__name__, exc)
                    return trio.lowlevel.Abort.SUCCEEDED
                finally:
                    aborting = False
            return trio.lowlevel.Abort.FAILED  # wait for the future to settle

        try:
            await trio.lowlevel.wait_task_rescheduled(abort)
        except BaseException:
            coro.close()
            raise


async def _bridge(
    loop: trio_asyncio.TrioEventLoop,
    func: Callable[..., Awaitable[Any]],
    *args: Any,
    direct: bool = False,
    **kwargs: Any,
) -> Any:
    """Run one driver call; whatever the driver raises comes out as a
    :class:`DatabaseError` (see :func:`translate_error`), so no driver error
    can end the service or look like a bug in a branch. ``direct`` steps the
    call from this Trio task (:func:`_drive`): for statements, which await
    nothing but the connection's own futures. Connecting, closing and
    listening run as asyncio tasks (they use timeouts and task identity)."""
    if loop.is_closed():
        raise DatabaseClosed(CLOSED_MESSAGE)
    try:
        if direct:
            return await _drive(func(*args, **kwargs))
        return await loop.run_aio_coroutine(func(*args, **kwargs))
    except (trio.Cancelled, KeyboardInterrupt, SystemExit):
        raise
    except (Exception, asyncio.CancelledError) as exc:
        translated = translate_error(exc, args[0] if args and isinstance(args[0], str) else None)
        if translated is None or translated is exc:
            raise
        if not isinstance(exc, (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
            log.debug(
                "database driver raised %s, treated as %s",
                type(exc).__name__,
                type(translated).__name__,
                exc_info=exc,
            )
        raise translated from exc


def _terminate(raw: Any) -> None:
    """Abort a connection or pool at once (no round trip); never raises."""
    try:
        raw.terminate()
    except Exception as exc:  # the socket may already be gone, the loop closing
        log.debug("terminating a database connection failed: %s: %s", type(exc).__name__, exc)


def _log_orphaned_error(loop: Any, context: dict[str, Any]) -> None:
    """asyncio exception handler: log what no caller awaited (see module doc)."""
    exception = context.get("exception")
    message = context.get("message") or "unhandled error in the asyncio loop"
    # A lost connection echoes here (asyncpg's own release or close task);
    # whoever used the connection has already reported the loss.
    echo = exception is not None and isinstance(translate_error(exception), ConnectionLost)
    log.log(
        logging.DEBUG if echo else logging.WARNING,
        "database driver: %s: %s",
        message,
        f"{type(exception).__name__}: {exception}" if exception is not None else "(no exception)",
    )


def _run_wakes_inline(loop: trio_asyncio.TrioEventLoop) -> None:
    """A settled future schedules its callbacks with ``loop.call_soon``; on
    trio-asyncio each is one more pass of Trio's scheduler before it runs.
    :func:`_drive`'s callback only reschedules a Trio task (no asyncio code
    runs in it, so nothing can re-enter), so it runs at once instead: one
    scheduler pass less per statement."""
    queue_soon = loop.call_soon

    def call_soon(callback: Callable[..., Any], *args: Any, context: Any = None) -> Any:
        if getattr(callback, "runs_inline", False):
            callback(*args)
            return None
        return queue_soon(callback, *args, context=context)

    loop.call_soon = call_soon
