"""Leader election on Awa's advisory lock.

::

        +----------+  pg_try_advisory_lock = true   +--------+
        | follower | -----------------------------> | leader |
        +----------+                                 +--------+
          ^   |  false: wait takeover_poll_interval,   |  |
          |   |  or less if a leader NOTIFYs release   |  | lock connection closed,
          |   |  error: back off 0.1 s doubling to 1 s |  | check failed, server no
          |   |  not a writable primary: no try, wait  |  | longer writable: cancel the
          |   +--------------<-------------------------+  | leader scope, retry at once
          +------ a branch kept crashing: release the ----+
                  lock, stay out 2 election intervals;
                  a database error starting the term:
                  release, back off as after an error

What follows a term that ends by itself (stay out, back off, wait for the
schema) is the term's outcome (:data:`TermOutcome`), decided by the code
that ran the term (:mod:`awa_trio.term_outcome`); the elector obeys it.

The lock is session-level, held on a dedicated (non-pooled) connection, with
the key every Awa runtime uses, so a mixed fleet elects exactly one leader.
Everything that needs the lock runs inside the leader scope; losing the lock
cancels that scope, so no branch body ever starts after the loss is known.
The connection is watched two ways: a termination listener (server killed
the backend, socket reset) fires at once; a ``pg_locks`` query every
``leader_check_interval`` catches a silent network loss.

Takeover. A follower keeps one dedicated connection and tries the lock on
it every ``takeover_poll_interval`` (250 ms). The try never waits, so the
follower holds no snapshot between tries (a session blocked in
``pg_advisory_lock`` keeps ``backend_xmin`` set for as long as it waits,
pinning the database's MVCC horizon) and never shows up as a lock wait. A
crashed leader's backend exits as soon as the kernel closes its socket, so
its lock is free within milliseconds and the next try takes it. On a
graceful release the leader unlocks and, in the same statement, NOTIFYs
``awa_trio_leader_released``; followers LISTEN on their election
connection and try at once. Errors back off from 100 ms, doubling up to
1 s (or ``leader_election_interval`` if shorter), so a node leads again
within about a second of its server (a restarted one, a promoted standby
behind a multi-host URL with ``target_session_attrs=read-write``) accepting
writes, and a long outage costs one connection attempt a second.

Only a writable primary is led from. The try and every lock check also read
``pg_is_in_recovery()`` and ``transaction_read_only``: on a standby or a
read-only server the lock is not tried (advisory locks work on a standby and
are not replicated: a "leader" there would be a second one whose every
write fails), a leader whose server turns read-only steps down, and the
reason is logged once, kept for /readyz (not ready) and /status.

A silent partition has a second half: the server keeps a vanished leader's
session, and with it the lock, until TCP gives up on the client, which with
the OS defaults takes more than two hours; no node can lead meanwhile. The
lock session therefore sets the server's keepalive and user timeout so the
server drops it after about ``lock_keepalive``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Awaitable, Callable

import trio

from .config import MaintenanceConfig
from .db import APPLICATION_NAME, Connection, Database, DatabaseError
from .logs import OutageLog, connection_recovered
from .sql import Statement

log = logging.getLogger(__name__)

#: "AWA_MAIN": the key of every Awa runtime's maintenance leader lock.
LOCK_KEY = 4708303813012965710
#: The election/lock connection: ``awa_trio <host>:<pid> lock``.
LOCK_APPLICATION_NAME = f"{APPLICATION_NAME} lock"
#: Upper bound for unlocking and closing the lock connection on the way out.
RELEASE_TIMEOUT = 5.0
#: Upper bound for one lock check; a hung check counts as a lost lock.
MAX_CHECK_TIMEOUT = 10.0
HISTORY_LENGTH = 100

# The lock is tried only on a writable primary: advisory locks work on a hot
# standby (and are not replicated), so a "leader" there would be a second
# one whose every write fails with 25006; a read-only server
# (default_transaction_read_only on the role, the database or the URL) would
# keep the lock from a healthy node elsewhere while every branch fails.
WRITABLE_SQL = "(NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off')"
# A try that fails also reads the holder's pid from pg_locks (same round
# trip, no pg_stat_activity scan on every poll: HOLDER_SQL names the session
# only when the pid changed); the MATERIALIZED attempt runs once, first.
TRY_LOCK_SQL = Statement(
    """
    WITH attempt AS MATERIALIZED (
        SELECT pg_is_in_recovery() AS in_recovery,
               current_setting('transaction_read_only') = 'on' AS read_only,
               CASE WHEN {writable} THEN pg_try_advisory_lock(:key) ELSE false END AS acquired,
               pg_backend_pid() AS backend_pid
    )
    SELECT attempt.*, holder.pid AS holder_pid
    FROM attempt
    LEFT JOIN LATERAL (
        SELECT l.pid
        FROM pg_locks AS l
        WHERE NOT attempt.acquired
          AND l.locktype = 'advisory'
          AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid::bigint = (:key::bigint >> 32)
          AND l.objid::bigint = (:key::bigint & 4294967295)
          AND l.objsubid = 1
        LIMIT 1
    ) AS holder ON true
""",
    writable=WRITABLE_SQL,
)
HOLDER_SQL = Statement("""
    SELECT application_name, host(client_addr) AS client_addr
    FROM pg_stat_activity
    WHERE pid = :pid
""")
#: Errors retry after this, doubling up to MAX_ERROR_BACKOFF (or the election
#: interval if shorter): a failover or a restart is led again within about a
#: second of the server accepting writes, and an outage costs one cheap
#: connection attempt a second.
FIRST_ERROR_BACKOFF = 0.1
MAX_ERROR_BACKOFF = 1.0
#: Followers LISTEN here; a leader NOTIFYs it as it lets the lock go.
RELEASE_CHANNEL = "awa_trio_leader_released"
#: ``python -m awa_trio resign`` NOTIFYs ``resign <backend pid>`` here, naming
#: the lock holder's backend: that leader resigns, every other listener
#: ignores it (the election connection LISTENs, and leads once elected).
CONTROL_CHANNEL = "awa_trio_control"
# The notification is delivered when this statement's transaction ends,
# after the unlock: a follower woken by it finds the lock free.
UNLOCK_SQL = Statement("""
    SELECT unlocked.released
    FROM (SELECT pg_advisory_unlock(:key) AS released) AS unlocked
    LEFT JOIN LATERAL (
        SELECT pg_notify(:channel, '') WHERE unlocked.released
    ) AS notified ON true
""")
# A bigint advisory key shows in pg_locks as classid = high 32 bits,
# objid = low 32 bits, objsubid = 1.
HOLDS_LOCK_SQL = Statement("""
    SELECT EXISTS (
        SELECT 1
        FROM pg_locks
        WHERE locktype = 'advisory'
          AND pid = pg_backend_pid()
          AND granted
          AND classid::bigint = (:key::bigint >> 32)
          AND objid::bigint = (:key::bigint & 4294967295)
          AND objsubid = 1
    ) AS held,
    pg_is_in_recovery() AS in_recovery,
    current_setting('transaction_read_only') = 'on' AS read_only
""")


def unwritable_reason(server: str, in_recovery: bool, read_only: bool) -> str | None:
    """Why a server cannot be led from (one line naming the fix), or None."""
    if in_recovery:
        return (
            f"{server} is a standby (in recovery): point awa_trio at the primary, or list every "
            "host in the URL with target_session_attrs=read-write"
        )
    if read_only:
        return (
            f"{server} is read-only for this session (default_transaction_read_only is on for the "
            "role, the database or the URL): turn it off for the maintenance role"
        )
    return None


def lock_keepalive_settings(budget: float) -> dict[str, str]:
    """Server-side TCP settings that make the server drop the lock session
    about ``budget`` seconds after its client went silent (idle + 4 probes,
    and the same bound on unacknowledged data); empty for 0. PostgreSQL
    ignores them on Unix-domain sockets, where a vanished client is seen at
    once anyway."""
    if budget <= 0:
        return {}
    idle = max(1, round(budget / 3))
    interval = max(1, round((budget - idle) / 4))
    return {
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": "4",
        "tcp_user_timeout": str(max(1000, round(budget * 1000))),
    }


@dataclasses.dataclass(frozen=True)
class StandAgain:
    """The lock was lost (the check failed, the server went read-only):
    stand again at once."""


@dataclasses.dataclass(frozen=True)
class HoldOff:
    """Stay a follower for ``seconds``, then stand again: a node that gave
    up leadership on purpose (``reason`` says why, logged once) or resigned."""

    seconds: float
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class RetryAfterError:
    """The term could not start (its start-up queries failed): stand again
    after the error backoff, as after a failed election attempt."""

    reason: str


@dataclasses.dataclass(frozen=True)
class WaitUntil:
    """Follow, without standing, until ``check`` finds nothing wrong (returns
    None); it runs every ``every`` seconds and returns why the node still
    cannot lead. Meanwhile ``reason`` (then the check's latest answer) is
    the node's ``not_leading_reason``."""

    reason: str
    check: Callable[[], Awaitable[str | None]]
    every: float
    #: Names the check in the line logged when it fails (it is retried).
    check_name: str
    #: The line logged once the check passes.
    passed: str


#: What the elector does after a term: each term's end is one of these,
#: decided by the code that knows why it ended (see LeaderElector).
TermOutcome = StandAgain | HoldOff | RetryAfterError | WaitUntil
#: Turns the exception group a term ended with into what to do next; None
#: for a group it does not know (a bug), which then propagates.
OutcomeOf = Callable[[BaseExceptionGroup[BaseException]], TermOutcome | None]


def no_outcome(_group: BaseExceptionGroup[BaseException]) -> None:
    """The OutcomeOf of an elector told nothing: every error propagates."""
    return None


class LeadershipState:
    """Readable by the embedding application; waitable without polling."""

    def __init__(self) -> None:
        self.is_leader = False
        self.is_alive = False
        #: Backend pid of the lock connection while leading (None otherwise).
        self.lock_backend_pid: int | None = None
        #: Recent (trio time, is_leader) changes, newest last; for diagnostics and tests.
        self.history: collections.deque[tuple[float, bool]] = collections.deque(maxlen=HISTORY_LENGTH)
        #: Why this node cannot lead now (a standby, a read-only server), or None.
        self.not_leading_reason: str | None = None
        #: The last election attempt's error while they fail, else None.
        self.unreachable_reason: str | None = None
        self._changed = trio.Event()

    def set_leader(self, value: bool) -> None:
        if value != self.is_leader:
            self.is_leader = value
            self.history.append((trio.current_time(), value))
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for_change(self) -> bool:
        """Wait for the next leadership change; returns the new value."""
        await self._changed.wait()
        return self.is_leader

    async def wait_until(self, leader: bool) -> None:
        while self.is_leader != leader:
            await self.wait_for_change()


class ErrorBackoff:
    """Sleeps after errors: FIRST_ERROR_BACKOFF, doubling up to
    MAX_ERROR_BACKOFF (or ``ceiling`` if shorter); reset once the server
    answers."""

    def __init__(self, ceiling: float):
        self._ceiling = min(MAX_ERROR_BACKOFF, ceiling)
        self._next = min(FIRST_ERROR_BACKOFF, self._ceiling)

    def reset(self) -> None:
        self._next = min(FIRST_ERROR_BACKOFF, self._ceiling)

    async def sleep(self) -> None:
        delay = self._next
        self._next = min(self._ceiling, self._next * 2)
        await trio.sleep(delay)


class LeaderElector:
    """Follower/leader loop. ``lead`` is started in the leader scope with
    ``nursery.start`` and must run until cancelled. A term that ends by
    itself ends with an exception group, which ``outcome_of`` (written
    beside the term) turns into a :data:`TermOutcome`; the elector obeys it
    and decides nothing about why a term ended."""

    def __init__(
        self,
        db: Database,
        config: MaintenanceConfig,
        state: LeadershipState,
        lead: Callable[..., Awaitable[None]],
        *,
        outcome_of: OutcomeOf = no_outcome,
        lock_dsn: str | None = None,
    ):
        self._db = db
        self._config = config
        self._state = state
        self._lead = lead
        self._outcome_of = outcome_of
        #: Where the lock connection goes (None: the pool's URL).
        self._lock_dsn = lock_dsn
        #: The two reasons not to lead; LeadershipState.not_leading_reason
        #: shows either: the server is not writable, or a WaitUntil's check
        #: has not passed yet.
        self._unwritable: str | None = None
        self._waiting_for: str | None = None
        #: The connection holding the lock while leading (diagnostics, tests).
        self.lock_connection: Connection | None = None
        #: Set when a leader announced a graceful release (see RELEASE_CHANNEL).
        self._release_heard = trio.Event()
        #: The election connection that LISTENs for release notices (a standby's does not).
        self._listening_on: Connection | None = None
        #: The backend pid of the lock holder this follower last said leads.
        self._leader_seen: int | None = None
        #: Set by resign() while leading; the term ends and the lock is released.
        self._resign_requested = trio.Event()
        #: The election attempts that fail in a row (the server is unreachable).
        self._outage = OutageLog(log, "leader election attempt")

    def reconfigure(self, config: MaintenanceConfig) -> None:
        """A reload: polls, checks and hold-offs use it from their next wait
        (the lock check's interval from the next term)."""
        self._config = config

    def resign(self) -> bool:
        """Hand the lock over now (graceful release: unlock + NOTIFY) and stay a
        follower for resign_hold_off; False if this node is not leading."""
        if not self._state.is_leader:
            return False
        self._resign_requested.set()
        return True

    async def _watch_resign(self, resigned: list[bool], scope: trio.CancelScope) -> None:
        await self._resign_requested.wait()
        resigned.append(True)
        log.info("resigning maintenance leadership; staying a follower for %gs", self._config.resign_hold_off)
        scope.cancel(reason="leader resigned")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        candidate: Connection | None = None
        backoff = ErrorBackoff(self._config.leader_election_interval)
        try:
            while True:
                candidate, acquired = await self._try_acquire(candidate)
                if not acquired:
                    if candidate is None:
                        await backoff.sleep()
                    else:
                        backoff.reset()
                        await self._wait_for_next_try()
                    continue
                backoff.reset()
                assert candidate is not None  # holding the lock means a connection
                lock, candidate = candidate, None
                outcome = await self._hold(lock)
                if isinstance(outcome, HoldOff):
                    await trio.sleep(outcome.seconds)
                elif isinstance(outcome, RetryAfterError):
                    await backoff.sleep()
                elif isinstance(outcome, WaitUntil):
                    await self._wait_until(outcome)
        finally:
            if candidate is not None:
                await candidate.close()

    def _on_release_notice(self, _payload: str) -> None:
        self._release_heard.set()

    def _on_control_notice(self, payload: str) -> None:
        command, _, target = payload.partition(" ")
        lock = self.lock_connection
        if command != "resign" or lock is None or target != str(lock.backend_pid):
            return
        log.info("resign requested through NOTIFY %s", CONTROL_CHANNEL)
        self.resign()

    async def _wait_for_next_try(self) -> None:
        """One poll interval, cut short by a leader's release notice."""
        with trio.move_on_after(self._config.takeover_poll_interval):
            await self._release_heard.wait()
        self._release_heard = trio.Event()

    async def _try_acquire(self, conn: Connection | None) -> tuple[Connection | None, bool]:
        """One election attempt on a dedicated connection, reused between a
        follower's attempts (and listening for release notices). Returns the
        connection (None after an error) and whether it now holds the lock."""
        try:
            if conn is None or conn.is_closed():
                conn = await self._db.connect_dedicated(
                    application_name=LOCK_APPLICATION_NAME,
                    server_settings=lock_keepalive_settings(self._config.lock_keepalive),
                    dsn=self._lock_dsn,
                )
            [row] = await conn.fetch(*TRY_LOCK_SQL.bind(key=LOCK_KEY))
            conn.note_backend_pid(row["backend_pid"])  # the real one, through a session-mode pooler too
            if not row["in_recovery"] and conn is not self._listening_on:
                # A standby refuses LISTEN: its session starts listening
                # once it is promoted (it polls meanwhile).
                await conn.listen(RELEASE_CHANNEL, self._on_release_notice)
                await conn.listen(CONTROL_CHANNEL, self._on_control_notice)
                self._listening_on = conn
        except DatabaseError as exc:
            self._outage.failed(exc)
            self._state.unreachable_reason = str(exc)
            if conn is not None:
                await conn.close()
            return None, False
        # The server answered: the next outage's first failure warns again.
        self._outage.recovered()
        self._state.unreachable_reason = None
        connection_recovered(log.name, log)
        self._note_writability(unwritable_reason(conn.server_address, row["in_recovery"], row["read_only"]))
        if row["read_only"] and not row["in_recovery"]:
            # A session keeps the read-only default it started with: only a
            # new one sees the role or database changed back (retried with
            # the error backoff). A standby's session, by contrast, sees its
            # promotion in place and polls on.
            await conn.close()
            return None, False
        if not row["acquired"] and row["holder_pid"] != self._leader_seen:
            await self._note_leader(conn, row["holder_pid"])
        return conn, bool(row["acquired"])

    async def _note_leader(self, conn: Connection, holder_pid: int | None) -> None:
        """One line on becoming a follower and one each time the leader
        changes, naming the session that holds the lock (a follower is
        otherwise silent for as long as it follows)."""
        if holder_pid is None:
            return  # free between two tries (a release, a crash): the next try says
        self._leader_seen = holder_pid
        try:
            session = await conn.fetchrow(*HOLDER_SQL.bind(pid=holder_pid))
        except DatabaseError as exc:
            log.debug("could not name the lock holder %d: %s", holder_pid, exc)
            session = None
        application_name = session["application_name"] if session else None
        client_addr = session["client_addr"] if session else None
        log.info(
            "following: the maintenance lock is held by backend pid %d (application_name %s, from %s)",
            holder_pid,
            repr(application_name) if application_name else "not visible",
            client_addr or "a local socket or not visible",
        )

    def _note_writability(self, reason: str | None) -> None:
        """One line when a server turns out not to be writable, one when it is again."""
        if reason == self._unwritable:
            return
        if reason is not None:
            log.warning("not leading: %s", reason)
        else:
            log.info("the server is a writable primary again; taking part in the election")
        self._unwritable = reason
        self._state.not_leading_reason = self._unwritable or self._waiting_for

    def _note_waiting_for(self, reason: str | None) -> None:
        self._waiting_for = reason
        self._state.not_leading_reason = self._unwritable or self._waiting_for

    async def _wait_until(self, outcome: WaitUntil) -> None:
        """Follow, without the lock, until the outcome's check passes."""
        while self._waiting_for is not None:
            await trio.sleep(outcome.every)
            try:
                problem = await outcome.check()
            except DatabaseError as exc:
                log.debug("%s failed (will retry): %s", outcome.check_name, exc)
                continue
            if problem is None:
                log.info("%s; taking part in the election", outcome.passed)
            self._note_waiting_for(problem)

    def _announce(self, outcome: TermOutcome) -> None:
        """One line saying why the term ended and what this node does now."""
        if isinstance(outcome, WaitUntil):
            log.warning(
                "stepping down, not leading: %s; checking again every %gs", outcome.reason, outcome.every
            )
            self._note_waiting_for(outcome.reason)
        elif isinstance(outcome, HoldOff) and outcome.reason is not None:
            log.error("giving up leadership: %s", outcome.reason)
        elif isinstance(outcome, RetryAfterError):
            log.error("leadership term failed, releasing the lock and retrying: %s", outcome.reason)

    async def _hold(self, lock: Connection) -> TermOutcome:
        """Lead until the lock is lost or the term ends; always release."""
        lost = trio.Event()
        lock.on_termination(lost.set)
        outcome: TermOutcome = StandAgain()
        resigned: list[bool] = []
        self._resign_requested = trio.Event()
        self._state.lock_backend_pid = lock.backend_pid
        self.lock_connection = lock
        self._state.set_leader(True)
        self._leader_seen = None  # following again later names the leader again
        log.info("elected maintenance leader (lock backend pid %d)", lock.backend_pid)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_lock, lock, lost, nursery.cancel_scope)
                nursery.start_soon(self._watch_resign, resigned, nursery.cancel_scope)
                await nursery.start(self._lead)
        except BaseExceptionGroup as group:
            judged = self._outcome_of(group)
            if judged is None:
                raise
            outcome = judged
            self._announce(outcome)
        finally:
            self._state.set_leader(False)
            self._state.lock_backend_pid = None
            self.lock_connection = None
            await self._release(lock)
        if resigned:
            return HoldOff(self._config.resign_hold_off)
        return outcome

    async def _watch_lock(self, lock: Connection, lost: trio.Event, leader_scope: trio.CancelScope) -> None:
        interval = self._config.leader_check_interval
        check_timeout = min(interval, MAX_CHECK_TIMEOUT)
        while True:
            with trio.move_on_after(interval):
                await lost.wait()
            if lost.is_set():
                reason = "lock connection closed"
                break
            try:
                with trio.fail_after(check_timeout):
                    [row] = await lock.fetch(*HOLDS_LOCK_SQL.bind(key=LOCK_KEY))
            except DatabaseError as exc:
                reason = f"lock check failed: {exc}"
                break
            except trio.TooSlowError:
                reason = f"lock check failed: no answer within {check_timeout:g}s"
                break
            if not row["held"]:
                reason = "advisory lock no longer held by this session"
                break
            unwritable = unwritable_reason(lock.server_address, row["in_recovery"], row["read_only"])
            if unwritable is not None:
                # Demoted (or made read-only) under us: step down, and wait
                # as a follower until a writable primary is there again.
                self._note_writability(unwritable)
                reason = f"stepping down: {unwritable}"
                break
        self._state.set_leader(False)
        log.warning("lost maintenance leadership: %s", reason)
        leader_scope.cancel(reason=f"advisory lock lost: {reason}")

    async def _release(self, lock: Connection) -> None:
        """Unlock on the same connection and close it, shielded and bounded."""
        with trio.move_on_after(RELEASE_TIMEOUT, shield=True):
            if not lock.is_closed():
                try:
                    await lock.fetchval(*UNLOCK_SQL.bind(key=LOCK_KEY, channel=RELEASE_CHANNEL))
                    log.info("released maintenance leader lock")
                except DatabaseError as exc:
                    log.debug("unlock failed (closing the connection releases it): %s", exc)
        await lock.close()
