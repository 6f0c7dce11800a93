"""The trio-asyncio bridge against a real server."""

import pytest
import trio

from awa_trio.db import ConnectionLost, QueryError, UniqueViolation, open_database

# Only this test's database: other tests may be sleeping elsewhere on the server.
ACTIVE_SLEEPERS_SQL = """
    SELECT pid FROM pg_stat_activity
    WHERE state = 'active' AND query LIKE 'SELECT pg_sleep(30)%' AND pid <> pg_backend_pid()
      AND datname = current_database()
"""
BACKEND_ACTIVITY_SQL = "SELECT state, query FROM pg_stat_activity WHERE pid = $1"


async def test_cancel_scope_cancels_the_query_on_the_server(db):
    started = trio.current_time()
    with trio.move_on_after(0.2) as scope:
        await db.fetchval("SELECT pg_sleep(30)")
    assert scope.cancelled_caught
    assert trio.current_time() - started < 2.0
    # The cancel request travels on its own connection; give it a moment.
    with trio.fail_after(3):
        while await db.fetch(ACTIVE_SLEEPERS_SQL):
            await trio.sleep(0.05)
    # The pool is still usable afterwards.
    assert await db.fetchval("SELECT 1") == 1


async def test_cancelled_query_on_a_dedicated_connection_stops_on_its_backend(db):
    conn = await db.connect_dedicated(application_name="awa_trio cancel probe")
    try:
        with trio.move_on_after(0.2) as scope:
            await conn.fetchval("SELECT pg_sleep(30)")
        assert scope.cancelled_caught
        with trio.fail_after(3):
            while (await db.fetchrow(BACKEND_ACTIVITY_SQL, conn.backend_pid))["state"] == "active":
                await trio.sleep(0.05)
        activity = await db.fetchrow(BACKEND_ACTIVITY_SQL, conn.backend_pid)
        assert activity["state"] == "idle" and "pg_sleep(30)" in activity["query"]
        assert await conn.fetchval("SELECT 2") == 2
    finally:
        await conn.close()


async def test_server_errors_keep_their_sqlstate(db):
    with pytest.raises(QueryError) as caught:
        await db.fetchval("SELECT 1 / 0")
    assert caught.value.sqlstate == "22012"

    await db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    await db.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(UniqueViolation) as caught:
        await db.execute("INSERT INTO t VALUES (1)")
    assert caught.value.sqlstate == "23505"
    assert caught.value.constraint == "t_pkey"


async def test_unencodable_argument_is_a_query_error_not_a_lost_connection(db):
    with pytest.raises(QueryError, match="invalid input for query argument"):
        await db.fetchval("SELECT $1::int", "not a number")
    with pytest.raises(QueryError, match="not JSON serializable"):
        await db.fetchval("SELECT $1::jsonb", object())
    assert await db.fetchval("SELECT 1") == 1


async def test_connection_loss_is_typed_and_reported(db):
    conn = await db.connect_dedicated(application_name="awa_trio test victim")
    closed = trio.Event()
    conn.on_termination(closed.set)
    try:
        await db.execute("SELECT pg_terminate_backend($1)", conn.backend_pid)
        with trio.fail_after(3):
            await closed.wait()
        with pytest.raises(ConnectionLost):
            await conn.fetchval("SELECT 1")
    finally:
        await conn.close()


async def test_connection_killed_mid_query_is_lost_with_its_sqlstate(db):
    conn = await db.connect_dedicated(application_name="awa_trio test victim")
    try:
        async def terminate_soon():
            await trio.sleep(0.2)
            await db.execute("SELECT pg_terminate_backend($1)", conn.backend_pid)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(terminate_soon)
            with pytest.raises(ConnectionLost) as caught:
                await conn.fetchval("SELECT pg_sleep(5)")
        assert caught.value.sqlstate == "08003"
        assert "administrator command" in str(caught.value)
    finally:
        await conn.close()


async def test_dedicated_connection_is_outside_the_pool(db):
    conn = await db.connect_dedicated(application_name="awa_trio dedicated")
    try:
        row = await db.fetchrow(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1", conn.backend_pid
        )
        assert row["application_name"] == "awa_trio dedicated"
        # Session state sticks to it: a session advisory lock stays held.
        assert await conn.fetchval("SELECT pg_try_advisory_lock(42)")
        holders = await db.fetch(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = 42 AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        assert [r["pid"] for r in holders] == [conn.backend_pid]
    finally:
        await conn.close()


async def test_transaction_rolls_back_on_error_and_on_cancel(db):
    await db.execute("CREATE TABLE t (id int)")
    with pytest.raises(ZeroDivisionError):
        async with db.transaction() as conn:
            await conn.execute("INSERT INTO t VALUES (1)")
            1 / 0  # noqa: B018 - raises inside the transaction on purpose
    with trio.move_on_after(0.2):
        async with db.transaction() as conn:
            await conn.execute("INSERT INTO t VALUES (2)")
            await conn.fetchval("SELECT pg_sleep(30)")
    async with db.transaction() as conn:
        await conn.execute("INSERT INTO t VALUES (3)")
    assert [r["id"] for r in await db.fetch("SELECT id FROM t")] == [3]


async def test_jsonb_round_trips_as_python_objects(db):
    assert await db.fetchval("SELECT $1::jsonb", {"a": [1, 2]}) == {"a": [1, 2]}
    assert await db.fetchval("SELECT ARRAY['{\"e\": 1}'::jsonb]") == [{"e": 1}]


async def test_unreachable_server_and_bad_urls_are_connection_errors():
    with pytest.raises(ConnectionLost, match=r"refused|Connect call failed"):
        async with open_database("postgresql://postgres@127.0.0.1:1/x", connect_timeout=2):
            pass
    with pytest.raises(ConnectionLost, match="invalid"):
        async with open_database("mysql://nope"):
            pass


async def test_missing_database_is_a_query_error_with_sqlstate(database_url):
    missing = database_url.rsplit("/", 1)[0] + "/awa_trio_no_such_db"
    with pytest.raises(QueryError) as caught:
        async with open_database(missing):
            pass
    assert caught.value.sqlstate == "3D000"


async def test_errors_nobody_awaits_are_logged_and_the_database_stays_usable(db, caplog):
    """What asyncpg reports when, after a cancel, it fails to release a pooled
    connection whose socket is gone (seen when the network went away): by
    default trio-asyncio raises it into the loop's nursery, ending whatever
    owns the database, the maintenance service included."""
    db._loop.call_exception_handler({
        "message": "Task exception was never retrieved",
        "exception": ConnectionError("unexpected connection_lost() call"),
    })
    await trio.sleep(0.05)
    assert await db.fetchval("SELECT 1") == 1
    assert ("database driver: Task exception was never retrieved: "
            "ConnectionError: unexpected connection_lost() call") in caplog.text


async def test_a_connection_cancelled_mid_statement_is_closed_not_lent_again(db):
    """The pool never lends a connection whose last statement was cancelled:
    the next borrower gets a fresh session, and the database's own closer
    task closes the old one on the server."""
    doubtful = await db.fetchval("SELECT pg_backend_pid()")
    with trio.move_on_after(0.3):
        await db.fetchval("SELECT pg_backend_pid(), pg_sleep(30)")
    assert await db.fetchval("SELECT pg_backend_pid()") != doubtful
    with trio.fail_after(10):
        while await db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", doubtful):
            await trio.sleep(0.05)


async def test_a_connection_refused_a_statement_is_lent_again(db):
    """A server error leaves the session clean (the reply was read whole)."""
    session = await db.fetchval("SELECT pg_backend_pid()")
    with pytest.raises(QueryError):
        await db.fetchval("SELECT 1 / 0")
    assert await db.fetchval("SELECT pg_backend_pid()") == session


async def test_a_connection_whose_borrower_raised_its_own_exception_is_lent_again(db):
    """A blocked prune raises its own exception after a completed statement
    (inside a rolled-back transaction): the session is idle and is kept."""

    class Blocked(Exception):
        pass

    with pytest.raises(Blocked):
        async with db.transaction() as conn:
            session = await conn.fetchval("SELECT pg_backend_pid()")
            raise Blocked
    assert await db.fetchval("SELECT pg_backend_pid()") == session


async def test_pooled_connections_outlive_a_ten_second_lull(database_url):
    """Branches that tick together every 30 or 60 s find their connections
    still open (an idle leader used to reconnect every 7.5 s)."""
    async with open_database(database_url, pool_size=3) as db:

        async def backend(pids):
            async with db.acquire() as conn:
                pids.add(conn.backend_pid)
                await trio.sleep(0.2)  # all three borrowed at once

        async def burst():
            pids: set[int] = set()
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(backend, pids)
            return pids

        first = await burst()
        await trio.sleep(11)
        assert await burst() == first
        db.drop_idle_connections()
        with trio.fail_after(5):
            while await db.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])",
                                    list(first)):
                await trio.sleep(0.05)


async def test_a_cancelled_task_sends_no_statement(db):
    """No checkpoint comes before a statement leaves (the pool lends without
    one, the driver's first step sends it), so a task whose scope is already
    cancelled must find out before that step, on a pooled connection and on
    a dedicated one."""
    await db.execute("CREATE TABLE sent (via text)")
    conn = await db.connect_dedicated()
    try:
        for via, target in (("pool", db), ("dedicated", conn)):
            # Prepared already, as a branch's statements are after one tick:
            # the driver's first step then sends the statement itself.
            await target.execute("INSERT INTO sent VALUES ($1)", "warm-up")
            with trio.CancelScope() as scope:
                scope.cancel()
                await target.execute("INSERT INTO sent VALUES ($1)", via)
            assert scope.cancelled_caught
    finally:
        await conn.close()
    assert await db.fetchval("SELECT count(*) FROM sent WHERE via <> 'warm-up'") == 0


async def test_transactions_are_read_committed_whatever_the_database_default(database_url):
    # A later statement of a transaction must see what committed while an
    # earlier one waited for a lock (the queue-storage lane-order invariant).
    async with open_database(database_url) as db:
        database = await db.fetchval("SELECT current_database()")
        await db.execute(f'ALTER DATABASE "{database}" SET default_transaction_isolation = \'repeatable read\'')
    async with open_database(database_url) as db:
        async with db.transaction() as conn:
            assert await conn.fetchval("SHOW transaction_isolation") == "read committed"
        dedicated = await db.connect_dedicated()
        try:
            assert await dedicated.fetchval("SHOW transaction_isolation") == "read committed"
        finally:
            await dedicated.close()


async def test_local_settings_go_with_the_begin_and_end_with_the_transaction(db):
    async with db.transaction(local_settings={"enable_sort": "off"}) as conn:
        assert await conn.fetchval("SHOW enable_sort") == "off"
        pid = conn.backend_pid
    async with db.acquire() as conn:
        assert conn.backend_pid == pid  # the same pooled connection, back to its default
        assert await conn.fetchval("SHOW enable_sort") == "on"
    with pytest.raises(QueryError):
        async with db.transaction(local_settings={"enable_sort": "off"}) as conn:
            await conn.execute("SELECT 1/0")
    assert await db.fetchval("SELECT 1") == 1


async def test_commit_with_sends_the_last_statement_and_the_commit_together(db):
    await db.execute("CREATE TABLE commit_with (n int)")
    async with db.transaction(local_settings={"enable_sort": "off"}) as conn:
        await conn.execute("INSERT INTO commit_with VALUES (1)")
        await conn.commit_with("INSERT INTO commit_with VALUES (2); COMMIT")
    assert await db.fetchval("SELECT array_agg(n ORDER BY n) FROM commit_with") == [1, 2]
    # An error in the last statement: the COMMIT is not reached, all rolls back.
    with pytest.raises(QueryError):
        async with db.transaction(local_settings={"enable_sort": "off"}) as conn:
            await conn.execute("INSERT INTO commit_with VALUES (3)")
            await conn.commit_with("INSERT INTO commit_with VALUES (4); SELECT 1/0; COMMIT")
    assert await db.fetchval("SELECT array_agg(n ORDER BY n) FROM commit_with") == [1, 2]
    async with db.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM commit_with") == 2  # the pool's connections are clean
