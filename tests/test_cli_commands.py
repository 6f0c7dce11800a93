"""The command line as a user meets it: one parser per command, a
suggestion for a mistyped command, machine output that stays JSON, no
traceback on a closed pipe, ``migrate`` that fails fast and says which
engine it left, and every exit code README documents."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import trio
from test_cli import one_line, run_cli

from awa_trio import MaintenanceConfig, MaintenanceService
from awa_trio.cli import COMMANDS

README = Path(__file__).resolve().parent.parent / "README.md"
FAST = MaintenanceConfig(leader_election_interval=0.2, leader_check_interval=1)


@pytest.mark.parametrize(
    ("command", "has", "has_not"),
    [
        ("demo", ["--engine", "--duration", "--metrics-addr"], ["--promote-interval", "--json", "--role"]),
        ("status", ["--json", "--heartbeat-staleness", "--database-url"], ["--duration", "--role", "--admin-addr"]),
        ("grants", ["--role", "--database-url"], ["--json", "--promote-interval", "--duration"]),
        ("resign", ["--timeout", "--lock-database-url"], ["--json", "--engine"]),
        ("migrate", ["--engine", "--database-url"], ["--promote-interval", "--json"]),
        ("run", ["--promote-interval", "--admin-addr", "--periodic-job"], ["--json", "--role", "--duration"]),
    ],
)
async def test_each_command_has_its_own_help_and_flags(command, has, has_not):
    result = await run_cli(command, "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    assert text.startswith(f"usage: python -m awa_trio {command} "), text[:200]
    options = set(re.findall(r"(--[a-z][a-z-]+)", text))
    assert set(has) <= options and not set(has_not) & options, sorted(options)
    # A flag of another command is refused, naming the command it belongs to.
    wrong = await run_cli(command, has_not[0], "1s")
    assert wrong.returncode == 2
    assert f"{has_not[0]} is not an option of {command}; it belongs to " in one_line(wrong.stderr)


async def test_the_top_level_help_lists_every_command():
    text = (await run_cli("--help")).stdout.decode()
    for command in COMMANDS:
        assert re.search(rf"^  {command} +\S", text, re.M), command


@pytest.mark.parametrize(("typed", "meant"), [("stauts", "status"), ("migarte", "migrate"), ("doctr", "doctor")])
async def test_a_mistyped_command_gets_the_nearest_one(typed, meant):
    result = await run_cli(typed)
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        f"awa_trio: invalid configuration: unknown command {typed!r}; did you mean {meant!r}?")
    nothing_near = await run_cli("frobnicate")
    assert one_line(nothing_near.stderr).endswith(f"(commands: {', '.join(COMMANDS)})")


@pytest.mark.parametrize("url", ["postgresql://localhost:99999/x", "postgresql://a:5432,b:70000/x",
                                 "postgresql://[::1]:65536/x", "postgresql://localhost/x?port=0"])
async def test_a_port_out_of_range_is_a_usage_error_not_another_port(url):
    result = await run_cli("status", "--database-url", url)
    assert result.returncode == 2
    assert re.fullmatch(r"awa_trio: invalid configuration: invalid database URL \S+: port \d+ is out of "
                        r"range \(1-65535\)", one_line(result.stderr)), result.stderr


@pytest.mark.parametrize("command", ["status", "doctor"])
async def test_json_output_is_json_in_every_outcome(command, database_url):
    unreachable = await run_cli(command, "--json", "--database-url", "postgresql://postgres@127.0.0.1:1/awa")
    expected_code = 2 if command == "doctor" else 1
    assert unreachable.returncode == expected_code
    error = json.loads(unreachable.stdout)
    assert error["exit_code"] == expected_code and error["error"].startswith("cannot use database ")
    bad_flag = await run_cli(command, "--json", "--heartbeat-staleness", "soon")
    assert bad_flag.returncode == 2
    assert json.loads(bad_flag.stdout)["exit_code"] == 2
    fine = await run_cli(command, "--json", "--database-url", database_url)
    json.loads(fine.stdout)


@pytest.mark.parametrize("command", ["doctor --json", "status --json", "status", "--help", "demo --help",
                                     "--print-config"])
async def test_a_closed_pipe_ends_the_output_quietly(command, database_url):
    """``| head -1`` once the reader has gone: a pipe whose read end is
    closed before the command writes, so every write fails (no race)."""
    import os

    argv = [sys.executable, "-m", "awa_trio", *command.split()]
    if "--help" not in command and "--print-config" not in command:
        argv += ["--database-url", database_url]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with trio.fail_after(30):
            result = await trio.run_process(argv, stdout=write_end, capture_stderr=True, check=False)
    finally:
        os.close(write_end)
    assert result.stderr == b"", result.stderr.decode()
    assert result.returncode in (0, 1, 2, 3), result.returncode


async def test_migrate_fails_fast_with_the_real_cause_when_the_server_is_down():
    began = trio.current_time()
    result = await run_cli("migrate", "--database-url", "postgresql://postgres@127.0.0.1:1/awa")
    assert trio.current_time() - began < 10  # awa-pg's pool alone waits 30 s
    assert result.returncode == 1
    assert one_line(result.stderr).startswith(
        "awa_trio: cannot use database postgresql://postgres@127.0.0.1:1/awa: ConnectionRefusedError")


async def test_migrate_says_which_engine_it_left_and_installs_queue_storage_on_request(empty_database_url):
    plain = await run_cli("migrate", "--database-url", empty_database_url)
    assert plain.returncode == 0, plain.stderr
    line = plain.stdout.decode()
    assert re.search(r"awa schema \d+ installed in .*; it is on the canonical engine \(state canonical\)\. "
                     r"The first awa-pg runtime", line), line
    assert "`migrate --engine queue_storage` switches it now" in line
    switched = await run_cli("migrate", "--engine", "queue_storage", "--database-url", empty_database_url)
    assert switched.returncode == 0, switched.stderr
    assert ("queue storage is live (awa.storage_status(): engine queue_storage, state active)"
            in switched.stdout.decode())
    assert await active_engine(empty_database_url) == "queue_storage"
    again = await run_cli("migrate", "--engine", "queue_storage", "--database-url", empty_database_url)
    assert again.returncode == 0 and "queue storage is live" in again.stdout.decode()


async def test_migrate_to_queue_storage_refuses_a_database_that_holds_jobs(database_url, awa_client):
    from conftest import in_thread

    await in_thread(awa_client.insert, {"n": 1}, kind="kept")
    result = await run_cli("migrate", "--engine", "queue_storage", "--database-url", database_url)
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        "awa_trio: this database holds jobs on the canonical engine (state canonical): switch it to queue "
        "storage with Awa's staged transition (prepare, enter, finalize), not at install")
    assert await active_engine(database_url) == "canonical"


async def active_engine(url: str) -> str:
    from awa_trio.db import open_database

    async with open_database(url, pool_size=1) as db:
        return await db.fetchval("SELECT active_engine FROM awa.storage_status()")


def documented_exit_codes() -> dict[int, str]:
    """README's exit-code table: code -> meaning."""
    rows = re.findall(r"^\| (\d) \| (.+) \|$", README.read_text(), re.M)
    return {int(code): meaning for code, meaning in rows}


async def test_every_exit_code_readme_documents(database_url, empty_database_url, tmp_path):
    """Each code of README's table, by the cases it names."""
    documented = documented_exit_codes()
    assert sorted(documented) == [0, 1, 2, 3]
    bad_file = tmp_path / "bad.toml"
    bad_file.write_text("[maintenance]\npromote_intervall = '1s'\n")
    cases = {
        0: [("--print-config",)],
        1: [("status", "--database-url", "postgresql://postgres@127.0.0.1:1/awa"),  # unreachable
            ("status", "--database-url", empty_database_url),  # no supported schema
            ("migrate", "--database-url", "postgresql://postgres@127.0.0.1:1/awa")],
        2: [("--frobnicate",), ("--promote-interval", "soon"), ("--database-url", "postgresql://h:99999/x"),
            ("--config", str(bad_file)), ("--print-config", "--disable-branch", "nope"), ("stauts",)],
        3: [("status", "--database-url", database_url), ("resign", "--database-url", database_url,
                                                          "--timeout", "1s")],
    }
    for code, argvs in cases.items():
        for argv in argvs:
            result = await run_cli(*argv)
            assert result.returncode == code, (argv, result.stderr.decode())
    # 0 for status, and resign's 0, once a node leads and another follows.
    first, second = MaintenanceService(database_url, FAST), MaintenanceService(database_url, FAST)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        with trio.fail_after(10):
            await first.wait_until_leader()
        await nursery.start(second.run)
        led = await run_cli("status", "--database-url", database_url)
        assert led.returncode == 0, led.stderr
        resigned = await run_cli("resign", "--database-url", database_url, "--timeout", "10s")
        assert resigned.returncode == 0, resigned.stderr
        nursery.cancel_scope.cancel()


async def test_a_bad_value_in_the_config_file_names_the_file_and_a_flag_beats_it(tmp_path):
    config = tmp_path / "awa_trio.toml"
    config.write_text("[maintenance]\npromote_interval = 'soon'\n")
    bad = await run_cli("--config", str(config), "--print-config")
    assert bad.returncode == 2
    assert one_line(bad.stderr) == (
        f"awa_trio: invalid configuration: {config}: [maintenance] promote_interval: cannot read 'soon' as a "
        "duration (use e.g. 250ms, 30s, 5m, 24h, 30d or plain seconds)")
    overridden = await run_cli("--config", str(config), "--promote-interval", "1s", "--print-config")
    assert overridden.returncode == 0, overridden.stderr
    from_flag = await run_cli("--config", str(config), "--promote-interval", "0s", "--print-config")
    assert one_line(from_flag.stderr) == "awa_trio: invalid configuration: promote_interval must be > 0"


async def test_the_demo_names_the_way_out_of_a_port_in_use_before_any_set_up():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = await run_cli("demo", "--metrics-addr", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        f"awa_trio: invalid configuration: the demo cannot serve its endpoints on 127.0.0.1:{port}: Address "
        "already in use; choose another address with --metrics-addr HOST:PORT (127.0.0.1:0 takes any free port)")
    assert b"starting a throwaway PostgreSQL" not in result.stdout
