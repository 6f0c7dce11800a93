"""Prometheus metrics, health and status over HTTP, served on Trio.

``serve_http(service, "127.0.0.1:9464")`` runs a Hypercorn server (ASGI, with
its Trio worker) inside the caller's nursery, so it stops with the service:

* ``GET /metrics``: Prometheus exposition of the ``awa`` meter (Awa's
  names, so Awa's Grafana dashboard and alert rules work unchanged) plus
  ``awa_trio_*`` leader metrics, from the prometheus_client registry that
  :func:`prometheus_meter_provider` feeds;
* ``GET /livez``: 200 while the Trio loop answers;
* ``GET /readyz``: 200 when the database answers, its schema is one
  awa_trio maintains and its server is a writable primary, leader or
  follower; 503 with the reason otherwise;
* ``GET /status``: JSON: leadership, schema and storage state, and per
  branch the tracker actor's snapshot (last run, duration, error, cooldown,
  prune backoff), plus the hook queue depth.

Nothing there changes the running service: it answers GET and HEAD only.
What does (reload, resign, pause and resume) is on a second listener,
``serve_admin(service, "127.0.0.1:9465")``, which binds to loopback unless
told otherwise and refuses any request carrying an ``Origin`` header, so a
web page open in a browser on the same host cannot drive it:

* ``POST /reload``: re-read the config file and environment (SIGHUP does the same);
* ``POST /resign``: hand leadership over to a follower (SIGUSR1 does the same);
* ``POST /branches/NAME/pause`` and ``POST /branches/NAME/resume``;
* ``GET /status``: the same document as the metrics listener's.

Small hand-written ASGI apps: a handful of routes need no framework.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider

    from .config import MaintenanceConfig
    from .live import ReloadResult
    from .schema import SchemaInfo


class ServedService(Protocol):
    """What the listeners read and drive (MaintenanceService is one): the
    HTTP layer knows nothing else of the service."""

    @property
    def is_leader(self) -> bool: ...
    @property
    def not_leading_reason(self) -> str | None: ...
    @property
    def config(self) -> MaintenanceConfig: ...
    async def check_database(self) -> SchemaInfo: ...
    async def status(self) -> dict[str, Any]: ...
    def reload(self) -> ReloadResult: ...
    def resign(self) -> bool: ...
    def pause(self, branch: str) -> bool: ...
    def resume(self, branch: str) -> bool: ...


log = logging.getLogger(__name__)

#: A readiness probe must answer quickly even when the database does not.
READINESS_TIMEOUT = 2.0

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def parse_address(
    address: str, *, setting: str = "metrics_addr", default_host: str = "0.0.0.0"
) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) as (host, port); an empty host
    is ``default_host``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{setting} must be HOST:PORT, not {address!r}")
    host = host.strip("[]") or default_host
    return host, int(port)


def parse_admin_address(address: str) -> tuple[str, int]:
    """Like parse_address, but a bare ``PORT`` or ``:PORT`` binds to loopback."""
    if address.isdigit():
        address = f":{address}"
    return parse_address(address, setting="admin_addr", default_host="127.0.0.1")


def prometheus_meter_provider(instance_id: uuid.UUID | str | None = None) -> MeterProvider:
    """An SDK meter provider whose readings /metrics exposes, as the service
    ``awa_trio`` (``target_info``); ``instance_id`` is the process's id in
    awa.runtime_instances (MaintenanceService.instance_id), so a scrape and
    Awa's admin views name the same node."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    from .version import __version__

    attributes = {"service.name": "awa_trio", "service.version": __version__}
    if instance_id is not None:
        attributes["service.instance.id"] = str(instance_id)
    return MeterProvider(metric_readers=[PrometheusMetricReader()], resource=Resource.create(attributes))


class StatusApp:
    """The ASGI application."""

    def __init__(self, service: ServedService):
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await respond(send, 405, b"method not allowed\n", "text/plain")
            return
        path = scope["path"]
        if path == "/livez":
            await respond(send, 200, b"ok\n", "text/plain")
        elif path == "/readyz":
            ready, body = await self.readiness()
            await respond_json(send, 200 if ready else 503, body)
        elif path == "/status":
            status = await self.service.status()
            if not self.service.is_leader:
                # The reason /readyz gives, word for word (the database's own
                # answer now, not only the election's last error).
                ready, readiness = await self.readiness()
                if not ready:
                    status["not_leading_reason"] = readiness["reason"]
            await respond_json(send, 200, status)
        elif path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

            await respond(send, 200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        else:
            await respond(send, 404, b"not found (try /metrics, /livez, /readyz, /status)\n", "text/plain")

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        from .db import DatabaseError
        from .errors import UnsupportedSchema

        body: dict[str, Any] = {"leader": self.service.is_leader}
        try:
            with trio.fail_after(READINESS_TIMEOUT):
                schema = await self.service.check_database()
        except trio.TooSlowError:
            return False, {
                **body,
                "ready": False,
                "reason": f"database did not answer within {READINESS_TIMEOUT:g}s",
            }
        except (DatabaseError, UnsupportedSchema) as exc:
            return False, {**body, "ready": False, "reason": str(exc)}
        except Exception as exc:
            # Whatever else the check met (a pool closing under a handover):
            # not ready, saying what, never an error page from a probe.
            log.debug("readiness check failed", exc_info=True)
            return False, {**body, "ready": False, "reason": f"{type(exc).__name__}: {exc}"}
        if self.service.not_leading_reason is not None:
            # It would never lead there: not ready, whatever else is fine.
            return False, {**body, "ready": False, "reason": self.service.not_leading_reason}
        return True, {
            **body,
            "ready": True,
            "schema_version": schema.version,
            "engine": schema.engine,
            "state": schema.state,
        }


class AdminApp:
    """The ASGI application of the admin listener: every route that changes
    the running service, POST only."""

    def __init__(self, service: ServedService):
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = {name.lower() for name, _ in scope.get("headers", [])}
        if b"origin" in headers:
            # A browser's cross-site request: scripts and curl send no Origin.
            await respond_json(send, 403, {"error": "requests from web pages are refused"})
            return
        method, path = scope["method"], scope["path"].rstrip("/")
        if path == "/status" and method in ("GET", "HEAD"):
            await respond_json(send, 200, await self.service.status())
            return
        route = self._route(path)
        if route is None:
            await respond_json(
                send,
                404,
                {"error": "not found (POST /reload, /resign, /branches/NAME/pause, /branches/NAME/resume)"},
            )
            return
        if method != "POST":
            await respond_json(send, 405, {"error": f"{path} takes POST"})
            return
        status, body = route()
        await respond_json(send, status, body)

    def _route(self, path: str) -> Callable[[], tuple[int, dict[str, Any]]] | None:
        if path == "/reload":
            return self._reload
        if path == "/resign":
            return self._resign
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "branches" and parts[3] in ("pause", "resume"):
            branch, action = parts[2], parts[3]
            return lambda: self._pause(branch, action == "pause")
        return None

    def _reload(self) -> tuple[int, dict[str, Any]]:
        result = self.service.reload()
        return (200 if result.applied else 400), result.as_dict()

    def _resign(self) -> tuple[int, dict[str, Any]]:
        if self.service.resign():
            return 200, {"resigned": True, "hold_off": self.service.config.resign_hold_off}
        return 409, {"resigned": False, "error": "this node is not the leader"}

    def _pause(self, branch: str, pause: bool) -> tuple[int, dict[str, Any]]:
        try:
            changed = self.service.pause(branch) if pause else self.service.resume(branch)
        except ConfigError as exc:
            return 404, {"error": str(exc)}
        return 200, {"branch": branch, "paused": pause, "changed": changed}


async def lifespan(receive: Receive, send: Send) -> None:
    """ASGI lifespan: nothing to start or stop (both apps)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def respond_json(send: Send, status: int, document: Any) -> None:
    body = (json.dumps(document, indent=2, default=str) + "\n").encode()
    await respond(send, status, body, "application/json")


async def serve_http(
    service: ServedService,
    address: str,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve /metrics, /livez, /readyz and /status until cancelled; reports
    the bound addresses when listening (``127.0.0.1:0`` picks a free port)."""
    await _serve(StatusApp(service), parse_address(address), "metrics_addr", address, task_status)


async def serve_admin(
    service: ServedService,
    address: str,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin routes until cancelled (loopback unless ``address``
    names another host)."""
    host, port = parse_admin_address(address)
    if not _is_loopback(host):
        log.warning(
            "admin_addr %s is not a loopback address: anyone who reaches it can reload, resign and "
            "pause this node (the admin routes have no authentication)",
            address,
        )
    await _serve(AdminApp(service), (host, port), "admin_addr", address, task_status)


async def _serve(
    app: StatusApp | AdminApp,
    bind: tuple[str, int],
    setting: str,
    address: str,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    host, port = bind
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("awa_trio.http")
    config.graceful_timeout = 1.0
    listening = _ListeningReport(task_status)
    try:
        await serve(app, config, task_status=listening)  # type: ignore[arg-type]
    except BaseException as exc:
        error = None if listening.reported else _sole_os_error(exc)
        if error is None:
            raise
        # A port in use, a host that does not resolve: one line, not a traceback.
        reason = error.strerror or str(error)
        raise ConfigError(f"cannot listen on {setting} {address}: {reason}") from None


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _sole_os_error(exc: BaseException) -> OSError | None:
    """The OSError that ``exc`` is, or that a group around it holds alone
    (Hypercorn binds inside a nursery of its own)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, OSError) else None


class _ListeningReport:
    """Passes Hypercorn's start report on, remembering that it came (an
    OSError before it is a bad address; after it, something else)."""

    def __init__(self, task_status: trio.TaskStatus[list[str]]):
        self._task_status = task_status
        self.reported = False

    def started(self, value: list[str]) -> None:
        self.reported = True
        self._task_status.started(value)
