"""Schedules declared in code: the recorder against awa-pg 0.6.1's own
``periodic`` and ``derive_kind``, and --periodic-from / periodic_from /
``MaintenanceService(periodic_from=...)`` with good and bad input.

Rows are compared with a real awa-pg leader's in test_cron_declared_awa_pg.py.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import textwrap
from pathlib import Path

import awa
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from support.declared_schedules import declare

import awa_trio
from awa_trio.cli import build_service, resolve
from awa_trio.cron import PeriodicJob, PeriodicJobError, PeriodicRecorder, declared_periodic_jobs, derive_kind
from awa_trio.errors import ConfigError
from awa_trio.service import MaintenanceService

PACKAGE_ROOT = str(Path(awa_trio.__file__).parents[1])
URL = "postgresql://localhost/unused"  # nothing here connects


def test_the_recorder_has_awa_pg_0_6_1s_periodic_signature():
    theirs = inspect.signature(awa.AsyncClient.periodic)
    ours = inspect.signature(PeriodicRecorder.periodic)
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == [
        (p.name, p.kind, p.default) for p in theirs.parameters.values()
    ]


GOLDEN = ["SendEmail", "SMTPEmail", "OAuthRefresh", "PDFRenderJob", "ProcessV2Import", "HTMLToPDF",
          "IOError", "dict", "already_snake", "A", "AB", "ABc", "_Private", "X2Y", "Über", "ΣΑΣ", "İstanbul"]


@pytest.mark.parametrize("name", GOLDEN)
def test_kind_is_derived_as_awa_pg_derives_it(name):
    assert derive_kind(name) == awa.derive_kind(name)


@given(st.text(alphabet="ABCXYZabcxyz0189_", max_size=12))
def test_kind_matches_awa_pg_for_any_ascii_class_name(name):
    assert derive_kind(name) == awa.derive_kind(name)


def test_kind_matches_awa_pg_for_latin_greek_and_cyrillic_letters():
    # Every letter of these blocks, in each position the rule looks at.
    # (Characters added or changed after Unicode 14, Python 3.11's tables,
    # can differ from Rust's; none is in these blocks.)
    letters = [chr(cp) for cp in [*range(0x20, 0x250), *range(0x370, 0x530)] if chr(cp).isprintable()]
    names = [name for c in letters for name in ("a" + c + "b", "A" + c + "b", c + "Ab", "AB" + c, "1" + c + "b")]
    assert [derive_kind(n) for n in names] == [awa.derive_kind(n) for n in names]


def test_a_declaration_becomes_periodic_jobs_with_awa_pgs_defaults():
    jobs = {job.name: job for job in declared_periodic_jobs([declare])}
    assert list(jobs) == ["report_nightly", "digest_hourly", "odd_values"]
    digest = jobs["digest_hourly"]
    assert digest == PeriodicJob("digest_hourly", "0 * * * *", kind="smtp_digest",
                                 args={"to": ["a@example.com"], "mode": "json"})
    assert jobs["odd_values"].args == {"dec": 1.25, "big": float(2**70), "nan": None, "level": 3,
                                       "window": {"start": "02:00", "hours": 2}, "text": "ü ✓", "flag": True}


def refused(declaration) -> str:
    with pytest.raises(PeriodicJobError) as caught:
        declared_periodic_jobs([declaration])
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_declarations_awa_pg_or_awa_trio_refuses_are_errors_naming_the_schedule():
    def bad_expr(client):
        client.periodic("nightly", "61 * * * *", dict, {})

    def bad_zone(client):
        client.periodic("nightly", "0 * * * *", dict, {}, timezone="Mars/Olympus")

    def tuple_field(client):  # awa-pg refuses a tuple too: it is neither a list nor an object
        client.periodic("nightly", "0 * * * *", dict, {"pair": (1, 2)})

    def not_args(client):
        client.periodic("nightly", "0 * * * *", str, "text")

    def list_metadata(client):
        client.periodic("nightly", "0 * * * *", dict, {}, metadata=[1])

    def other_call(client):
        client.task(dict)

    def raises(client):
        raise KeyError("SETTINGS")

    async def coroutine(client):
        client.periodic("nightly", "0 * * * *", dict, {})

    def twice(client):
        client.periodic("nightly", "0 * * * *", dict, {})
        client.periodic("nightly", "5 * * * *", dict, {})

    assert "periodic job 'nightly': invalid cron expression '61 * * * *'" in refused(bad_expr)
    assert "periodic job 'nightly'" in refused(bad_zone) and "Mars/Olympus" in refused(bad_zone)
    assert "Cannot convert tuple to JSON" in refused(tuple_field)
    assert "must be a dataclass, pydantic BaseModel, or dict" in refused(not_args)
    assert "metadata must be a JSON object" in refused(list_metadata)
    assert "has only periodic(), not task()" in refused(other_call)
    assert "the declaration raised KeyError: 'SETTINGS'" in refused(raises)
    assert "must be a plain function" in refused(coroutine)
    assert "'nightly' is declared twice" in refused(twice)
    assert refused(raises).startswith(f"periodic_from {__name__}:")


def write_app(directory: Path, body: str) -> None:
    (directory / "myapp").mkdir()
    (directory / "myapp" / "__init__.py").write_text("")
    (directory / "myapp" / "schedules.py").write_text(textwrap.dedent(body))


APP = """
    import dataclasses

    @dataclasses.dataclass
    class CleanupOrders:
        days: int = 30

    def declare(client):
        client.periodic("cleanup_orders", "0 3 * * *", CleanupOrders, CleanupOrders(), queue="ops")
"""


async def print_config(*args, cwd, env=None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWA_")}
    environ["PYTHONPATH"] = PACKAGE_ROOT
    environ.update(env or {})
    with trio.fail_after(30):
        return await trio.run_process(
            [sys.executable, "-m", "awa_trio", "--print-config", *args],
            cwd=cwd, env=environ, capture_stdout=True, capture_stderr=True, check=False)


async def test_periodic_from_imports_from_the_working_directory_and_pythonpath(tmp_path):
    write_app(tmp_path, APP)
    result = await print_config("--periodic-from", "myapp.schedules:declare", cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    document = json.loads(result.stdout)
    assert document["periodic_from"] == ["myapp.schedules:declare"]
    assert [(j["name"], j["kind"], j["queue"], j["args"]) for j in document["periodic_jobs"]] == [
        ("cleanup_orders", "cleanup_orders", "ops", {"days": 30})]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = await print_config(
        cwd=elsewhere,
        env={"AWA_PERIODIC_FROM": "myapp.schedules:declare",
             "PYTHONPATH": os.pathsep.join([PACKAGE_ROOT, str(tmp_path)])})
    assert result.returncode == 0, result.stderr.decode()
    assert [j["name"] for j in json.loads(result.stdout)["periodic_jobs"]] == ["cleanup_orders"]


@pytest.mark.parametrize(("target", "body", "message"), [
    ("nomodule.schedules:declare", APP, "no module named 'nomodule' (searched the working directory and PYTHONPATH)"),
    ("myapp.schedules:missing", APP, "myapp.schedules has no 'missing'"),
    ("myapp.schedules", APP, "must look like package.module:function"),
    ("myapp.schedules:declare", APP + "\n    import not_installed_anywhere\n",
     "importing myapp.schedules failed: No module named 'not_installed_anywhere'"),
    ("myapp.schedules:declare", APP.replace('"0 3 * * *"', '"0 3 * *"'),
     "periodic job 'cleanup_orders': invalid cron expression '0 3 * *'"),
    ("myapp.schedules:declare", APP.replace('queue="ops"', 'queue="ops", timezone="Europe/Londn"'),
     "periodic job 'cleanup_orders'"),
])
async def test_bad_periodic_from_is_a_one_line_error_exit_2(tmp_path, target, body, message):
    write_app(tmp_path, body)
    result = await print_config("--periodic-from", target, cwd=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.decode().strip().splitlines()
    assert line.startswith("awa_trio: invalid configuration: periodic_from") and message in line, line


async def test_a_name_both_declared_and_configured_is_an_error(tmp_path):
    write_app(tmp_path, APP)
    (tmp_path / "awa.toml").write_text(textwrap.dedent("""
        periodic_from = ["myapp.schedules:declare"]
        [[periodic_jobs]]
        name = "cleanup_orders"
        cron_expr = "0 4 * * *"
        kind = "cleanup_orders"
    """))
    result = await print_config("--config", "awa.toml", cwd=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.decode().strip().splitlines()
    assert "periodic job 'cleanup_orders' is both declared in code (periodic_from) and configured" in line


def test_the_config_file_key_takes_a_string_or_a_list_and_flags_win(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = tmp_path / "awa.toml"
    path.write_text('periodic_from = "support.declared_schedules:declare"\n')
    environ = {"AWA_CONFIG": str(path)}
    assert [j.name for j in resolve([], environ).periodic_jobs] == [
        "report_nightly", "digest_hourly", "odd_values"]
    path.write_text("periodic_from = 3\n")
    with pytest.raises(ConfigError, match="periodic_from must be a string or a list of strings"):
        resolve([], environ)
    path.write_text('periodic_from = ["support.declared_schedules:declare"]\n')
    assert len(resolve([], environ).periodic_jobs) == 3
    invocation = resolve(["--periodic-from", "support.declared_schedules:declare_probe"], environ)
    assert [j.name for j in invocation.periodic_jobs] == ["declared_probe"]
    # status does not import the application's code (it may not be installed where status runs).
    assert resolve(["status", "--periodic-from", "nowhere:declare"], {}).periodic_jobs == ()


def test_a_reload_calls_the_declaration_again_and_a_failing_one_keeps_the_old_schedules(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    for name in [name for name in os.environ if name.startswith("AWA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("DECLARED_PROBE_VERSION", "1")
    argv = ["--database-url", URL, "--periodic-from", "support.declared_schedules:declare_probe"]
    service = build_service(resolve(argv), with_metrics=False)
    assert [job.args for job in service.periodic_jobs] == [{"version": 1}]

    monkeypatch.setenv("DECLARED_PROBE_VERSION", "2")
    result = service.reload()
    assert result.applied and "periodic_jobs" in result.changed
    assert [job.args for job in service.periodic_jobs] == [{"version": 2}]

    monkeypatch.setenv("DECLARED_PROBE_VERSION", "two")
    result = service.reload()
    assert not result.applied and "ValueError" in result.error
    assert [job.args for job in service.periodic_jobs] == [{"version": 2}]


def test_embedding_takes_the_function_or_its_name_and_keeps_them_across_reconfigure():
    configured = PeriodicJob("heartbeat", "*/10 * * * * *", kind="heartbeat")
    service = MaintenanceService(URL, periodic_jobs=[configured], periodic_from=declare)
    assert [j.name for j in service.periodic_jobs] == ["heartbeat", "report_nightly", "digest_hourly", "odd_values"]
    by_name = MaintenanceService(URL, periodic_from=["support.declared_schedules:declare"])
    assert by_name.periodic_jobs == service.periodic_jobs[1:]

    service.reconfigure(service.config, periodic_jobs=[])
    assert [j.name for j in service.periodic_jobs] == ["report_nightly", "digest_hourly", "odd_values"]
    with pytest.raises(PeriodicJobError, match="both declared in code"):
        service.reconfigure(service.config, periodic_jobs=[
            PeriodicJob("digest_hourly", "0 * * * *", kind="digest")])
    with pytest.raises(PeriodicJobError, match="no module named 'nowhere'"):
        MaintenanceService(URL, periodic_from="nowhere:declare")
