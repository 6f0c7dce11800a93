"""TLS to PostgreSQL (issue 16): ``sslmode=require`` and ``verify-full`` for
the leader's lock connection, its pool, ``status`` and ``run``, against a
throwaway TLS-only server with a throwaway CA (support/tls_server.py); a
certificate that does not match is one error line; and no password, key
passphrase or client key path reaches any output.

The server is this module's own (its own port and directory), so this runs
with the normal suite without touching the shared server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from urllib.parse import quote, quote_plus

import pytest
import trio
from support.helpers import leader_lock_holders
from support.tls_server import (
    CERTIFIED_HOST,
    KEY_PASSPHRASE,
    PASSWORD,
    UNCERTIFIED_HOST,
    TlsServer,
    missing_tools,
    tls_server,
)
from test_cli import read_stderr_until, stop_and_collect

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.db import APPLICATION_NAME, open_database
from awa_trio.logs import SecretFilter, redact_url, secrets_of

FAST = MaintenanceConfig(leader_election_interval=0.2, leader_check_interval=0.3, promote_interval=0.05)
RUN_FLAGS = ("--leader-election-interval", "200ms", "--promote-interval", "50ms", "--log-level", "debug")
CLIENT_DN = "/CN=awa_tls"
DUE_JOB_SQL = (
    "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) "
    "VALUES ('tls_due', 'tls', 'scheduled', now() - interval '1 second') RETURNING id"
)
JOB_STATE_SQL = "SELECT state::text FROM awa.jobs WHERE id = $1"
#: Every session whose application_name matches, with its TLS state.
SSL_SESSIONS_SQL = """
    SELECT a.application_name, s.ssl, s.version, s.client_dn
    FROM pg_stat_activity AS a
    JOIN pg_stat_ssl AS s USING (pid)
    WHERE a.datname = current_database() AND a.application_name LIKE $1
"""


def require_url(server: TlsServer, **params) -> str:
    return server.url(sslmode="require", **params)


def verify_full_url(server: TlsServer, host: str = CERTIFIED_HOST, ca: str | None = None, **params) -> str:
    return server.url(host, sslmode="verify-full", sslrootcert=ca or str(server.certs.ca), **params)


def client_cert_url(server: TlsServer, host: str = "localhost", **overrides) -> str:
    """verify-full with a client certificate whose key needs ``sslpassword``."""
    params = {
        "sslcert": str(server.certs.client_cert),
        "sslkey": str(server.certs.client_key),
        "sslpassword": KEY_PASSPHRASE,
        **overrides,
    }
    return verify_full_url(server, host, **params)


def secret_spellings(server: TlsServer, *extra: str) -> list[str]:
    """Each secret as given and as it is written in a URL."""
    secrets = [PASSWORD, KEY_PASSPHRASE, str(server.certs.client_key), *extra]
    return sorted({form for secret in secrets for form in (secret, quote(secret, safe=""), quote_plus(secret))})


def assert_no_secret(text: str, server: TlsServer, *extra: str) -> None:
    leaked = [secret for secret in secret_spellings(server, *extra) if secret in text]
    assert not leaked, f"{leaked} in:\n{text[-3000:]}"


@pytest.fixture(scope="module")
def client_home(tmp_path_factory):
    """An empty HOME: asyncpg would otherwise use ~/.postgresql/root.crt and
    postgresql.crt/key, and ``require`` with a root.crt verifies against it."""
    return tmp_path_factory.mktemp("home")


def client_environ(home, **extra: str) -> dict[str, str]:
    """The environment of a CLI run: none of the test machine's AWA_ or PG
    settings, an empty HOME."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AWA_", "PG")) and key != "DATABASE_URL"
    }
    return {**environ, "HOME": str(home), **extra}


@pytest.fixture(autouse=True)
def isolated_client(monkeypatch, client_home):
    """The same isolation for the service embedded in this process."""
    for key in [key for key in os.environ if key.startswith("PG")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(client_home))


@pytest.fixture(scope="module")
def server(client_home):
    """A TLS-only server with the awa schema, installed over TLS by awa-pg's migrator."""
    reason = missing_tools()
    if reason:
        pytest.skip(f"TLS tests need a throwaway server: {reason}")
    with tls_server() as tls:
        migrate = subprocess.run(
            [sys.executable, "-m", "awa_trio", "migrate", "--database-url", verify_full_url(tls)],
            capture_output=True, text=True, timeout=120, check=False, env=client_environ(client_home),
        )
        assert migrate.returncode == 0, migrate.stderr + tls.server_log()[-2000:]
        assert_no_secret(migrate.stdout + migrate.stderr, tls)
        yield tls


@pytest.fixture
async def admin(server):
    """Superuser over the Unix socket, named so it is none of awa_trio's sessions."""
    async with open_database(server.admin_url(), application_name="tls_test_admin") as database:
        yield database


async def run_cli(home, *args: str, env: dict[str, str] | None = None):
    with trio.fail_after(60):
        return await trio.run_process(
            [sys.executable, "-m", "awa_trio", *args],
            capture_stdout=True, capture_stderr=True, check=False, env=client_environ(home, **(env or {})),
        )


async def wait_until_available(admin, job_id: int) -> None:
    with trio.fail_after(15):
        while await admin.fetchval(JOB_STATE_SQL, job_id) != "available":
            await trio.sleep(0.05)


def assert_all_sessions_use_tls(sessions, *, client_dn: str | None) -> None:
    """The lock session and at least one pool session, every one over TLS."""
    names = [row["application_name"] for row in sessions]
    assert any(name.endswith(" lock") for name in names), names
    assert any(not name.endswith(" lock") for name in names), names
    assert all(row["ssl"] for row in sessions), [dict(row) for row in sessions]
    assert all(row["client_dn"] == client_dn for row in sessions), [dict(row) for row in sessions]


@pytest.mark.parametrize(
    "make_url, client_dn",
    [
        (require_url, None),
        (verify_full_url, None),
        (client_cert_url, CLIENT_DN),
    ],
    ids=["require", "verify-full-ip", "verify-full-localhost-client-cert"],
)
async def test_an_embedded_service_leads_and_promotes_over_tls(server, admin, make_url, client_dn):
    job_id = await admin.fetchval(DUE_JOB_SQL)
    service = MaintenanceService(make_url(server), FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        with trio.fail_after(15):
            await service.wait_until_leader()
        await wait_until_available(admin, job_id)
        assert await leader_lock_holders(admin) == [service.lock_backend_pid]
        sessions = await admin.fetch(SSL_SESSIONS_SQL, f"{APPLICATION_NAME}%")
        service.stop()
    assert_all_sessions_use_tls(sessions, client_dn=client_dn)
    assert await leader_lock_holders(admin) == []


@pytest.mark.parametrize(
    "make_url, env, client_dn",
    [
        (client_cert_url, {}, CLIENT_DN),
        (lambda server: require_url(server, with_password=False), {"PGPASSWORD": PASSWORD}, None),
    ],
    ids=["verify-full-password-in-url-client-cert", "require-pgpassword"],
)
async def test_the_cli_runs_reports_status_and_stops_on_sigterm_over_tls(
    server, admin, client_home, make_url, env, client_dn
):
    url = make_url(server)
    job_id = await admin.fetchval(DUE_JOB_SQL)
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio", "--database-url", url, *RUN_FLAGS],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=client_environ(client_home, **env),
    )
    logs = b""
    try:
        logs = await read_stderr_until(process, logs, b"promote_scheduled: promoted 1 scheduled jobs")
        assert b"elected maintenance leader" in logs
        assert await admin.fetchval(JOB_STATE_SQL, job_id) == "available"
        sessions = await admin.fetch(SSL_SESSIONS_SQL, f"awa_trio %:{process.pid}%")
        status_text = await run_cli(client_home, "status", "--database-url", url, env=env)
        status_json = await run_cli(client_home, "status", "--json", "--database-url", url, env=env)
        logs = await stop_and_collect(process, logs, signal.SIGTERM)
    finally:
        if process.returncode is None:
            process.kill()
    text = logs.decode()
    assert process.returncode == 0, text
    assert "released maintenance leader lock" in text
    assert "Traceback" not in text
    assert_all_sessions_use_tls(sessions, client_dn=client_dn)

    assert status_text.returncode == 0, status_text.stderr.decode()
    assert f":{process.pid} lock" in status_text.stdout.decode()
    assert status_json.returncode == 0, status_json.stderr.decode()
    report = json.loads(status_json.stdout)
    assert report["lock_holder"]["application_name"].endswith(f":{process.pid} lock")
    for output in (text, status_text.stdout.decode(), status_text.stderr.decode(),
                   status_json.stdout.decode(), status_json.stderr.decode()):
        assert_no_secret(output, server)


WRONG_PASSPHRASE = "not-the-key-pass"


@pytest.mark.parametrize(
    "make_url, env, reason",
    [
        (lambda server: client_cert_url(server, UNCERTIFIED_HOST), {},
         f"IP address mismatch, certificate is not valid for '{UNCERTIFIED_HOST}'"),
        (lambda server: client_cert_url(server, ca=str(server.certs.other_ca)), {},
         "certificate verify failed"),
        (lambda server: verify_full_url(server, ca=str(server.certs.other_ca), with_password=False),
         {"PGPASSWORD": PASSWORD}, "certificate verify failed"),
        (lambda server: client_cert_url(server, sslpassword=WRONG_PASSPHRASE), {}, "SSL"),
        (lambda server: server.url(sslmode="disable"), {}, "no encryption"),
    ],
    ids=["verify-full-wrong-host", "verify-full-wrong-ca", "wrong-ca-pgpassword", "wrong-key-passphrase",
         "plaintext-rejected"],
)
@pytest.mark.parametrize("command", ["run", "status"])
async def test_a_connection_that_tls_refuses_is_one_line_without_secrets(
    server, client_home, make_url, env, reason, command
):
    result = await run_cli(client_home, command, "--database-url", make_url(server), env=env)
    assert result.returncode == 1, result.stderr.decode()
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert lines[0].startswith("awa_trio: cannot use database postgresql://awa_tls"), lines[0]
    assert reason in lines[0]
    assert_no_secret(lines[0] + result.stdout.decode(), server, WRONG_PASSPHRASE)


async def test_print_config_shows_no_secret(server, client_home):
    url = client_cert_url(server)
    flagged = await run_cli(client_home, "--print-config", "--database-url", url, env={"PGPASSWORD": PASSWORD})
    from_env = await run_cli(client_home, "--print-config", env={"AWA_DATABASE_URL": url, "PGPASSWORD": PASSWORD})
    for result in (flagged, from_env):
        assert result.returncode == 0, result.stderr.decode()
        json.loads(result.stdout)
        assert_no_secret(result.stdout.decode() + result.stderr.decode(), server)


def test_redact_url_hides_password_key_passphrase_and_key_path_only():
    url = (
        "postgresql://app:p%40ss@db1:5432,db2:5432/awa?sslmode=verify-full&sslrootcert=/etc/pki/ca.crt"
        "&sslcert=/etc/pki/app.crt&sslkey=/etc/pki/app.key&sslpassword=k%23y+pass"
    )
    assert redact_url(url) == (
        "postgresql://app:***@db1:5432,db2:5432/awa?sslmode=verify-full&sslrootcert=/etc/pki/ca.crt"
        "&sslcert=/etc/pki/app.crt&sslkey=***&sslpassword=***"
    )
    assert redact_url("postgresql://app@db/awa?sslmode=require") == "postgresql://app@db/awa?sslmode=require"


def test_secrets_of_a_tls_url_and_environment_are_scrubbed_from_logs():
    url = "postgresql://app:p%40ss@db/awa?sslkey=%2Fetc%2Fpki%2Fapp.key&sslpassword=k%23y+pass"
    secrets = secrets_of(url, {"PGPASSWORD": "env-pw", "PGSSLKEY": "/run/keys/app.key"})
    assert set(secrets) == {
        "p@ss", "p%40ss", "%2Fetc%2Fpki%2Fapp.key", "/etc/pki/app.key", "k%23y+pass", "k#y pass",
        "env-pw", "/run/keys/app.key",
    }
    scrub = SecretFilter(secrets).scrub
    assert scrub("could not load /etc/pki/app.key with k#y pass as app:p%40ss") == (
        "could not load *** with *** as app:***"
    )
