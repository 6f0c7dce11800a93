"""The deployment files in deploy/ are ones people can use: the systemd
unit passes ``systemd-analyze verify`` and a low exposure score, the
service speaks the notify protocol its ``Type=notify`` relies on, and the
Kubernetes manifests validate against the API's schemas."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "systemd" / "awa-trio.service"
MANIFESTS = ROOT / "deploy" / "kubernetes" / "awa-trio.yaml"
UNIT_EXEC = "/opt/awa-trio/bin/awa-trio"
#: systemd-analyze security's scale: 0 (locked down) to 10 ("UNSAFE"); OK is below 4.
MAX_EXPOSURE = 2.0

needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")


def unit_for_this_machine(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this environment's awa-trio
    (verify checks that the program exists)."""
    program = Path(sys.executable).with_name("awa-trio")
    assert program.exists(), program
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(UNIT_EXEC, str(program)))
    return unit


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


@needs_systemd
def test_the_systemd_unit_verifies_cleanly(tmp_path):
    unit = unit_for_this_machine(tmp_path)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


@needs_systemd
def test_the_systemd_unit_is_hardened(tmp_path):
    unit = unit_for_this_machine(tmp_path)
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    exposure = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout).group(1))
    assert exposure <= MAX_EXPOSURE, result.stdout


def test_the_unit_restarts_on_failure_but_not_on_a_configuration_error():
    settings = unit_settings()
    assert settings["Type"] == ["notify"] and settings["Restart"] == ["on-failure"]
    assert settings["RestartPreventExitStatus"] == ["2"]  # README: exit 2 is a configuration error
    assert settings["KillSignal"] == ["SIGTERM"] and settings["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    for key in ("DynamicUser", "NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert settings[key] == ["yes"], key
    assert settings["ProtectSystem"] == ["strict"]
    assert settings["ExecStart"][0].startswith(f"{UNIT_EXEC} run ")


async def test_the_service_speaks_the_notify_protocol(database_url, tmp_path):
    """What Type=notify and WatchdogSec rely on, from a real run: READY=1
    once started, the role as STATUS, RELOADING=1 then READY=1 on SIGHUP,
    watchdog pings, STOPPING=1 on SIGTERM, then exit 0."""
    address = str(tmp_path / "notify.sock")
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await listener.bind(address)
    env = {**os.environ, "NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"}
    received: list[str] = []

    async def receive_until(wanted: str, times: int = 1) -> None:
        with trio.fail_after(20):
            while sum(wanted in message.split("\n") for message in received) < times:
                received.append((await listener.recv(4096)).decode())

    with listener:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "awa_trio", "run", "--database-url", database_url,
             "--leader-election-interval", "200ms"],
            env=env, stderr=subprocess.DEVNULL)
        try:
            await receive_until("READY=1")
            await receive_until("STATUS=leading maintenance")
            await receive_until("WATCHDOG=1")
            process.send_signal(signal.SIGHUP)
            await receive_until("RELOADING=1")
            await receive_until("READY=1", times=2)
            process.send_signal(signal.SIGTERM)
            await receive_until("STOPPING=1")
            with trio.fail_after(20):
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
    assert code == 0
    ready = [i for i, message in enumerate(received) if "READY=1" in message.split("\n")]
    assert len(ready) == 2 and ready[0] < received.index("STATUS=leading maintenance"), received
    assert received.index("RELOADING=1") < ready[1] < received.index("STOPPING=1\nSTATUS=stopping: releasing leadership")
    assert received[0].split("\n") == ["READY=1", f"MAINPID={process.pid}"], received[:2]


def test_outside_systemd_notify_does_nothing(monkeypatch):
    from awa_trio import systemd

    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify("READY=1") is False
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", "1")  # another process's watchdog
    assert systemd.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd.watchdog_interval() == 15.0


def documents() -> list[dict]:
    import yaml

    return [document for document in yaml.safe_load_all(MANIFESTS.read_text()) if document]


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_the_kubernetes_manifests_validate_against_the_api_schemas(version):
    import kubernetes_validate

    kinds = []
    for document in documents():
        kubernetes_validate.validate(document, version, strict=True)
        kinds.append(document["kind"])
    assert kinds == ["Deployment", "PodDisruptionBudget"]


def test_the_deployment_runs_two_unprivileged_replicas_with_probes_and_a_secret_url():
    deployment, budget = documents()
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert spec["replicas"] == 2 and budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == spec["selector"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    [url] = [e for e in container["env"] if e["name"] == "AWA_DATABASE_URL"]
    assert "secretKeyRef" in url["valueFrom"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
    assert security["readOnlyRootFilesystem"] is True and security["capabilities"]["drop"] == ["ALL"]
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    # The probes reach the endpoints the container serves.
    assert "--metrics-addr" in container["args"]
    address = container["args"][container["args"].index("--metrics-addr") + 1]
    assert address.endswith(f":{container['ports'][0]['containerPort']}") and address.startswith("0.0.0.0:")
