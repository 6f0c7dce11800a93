"""Rescue side effects for the embedding application.

When the maintenance leader rescues a job (stale heartbeat, hard deadline,
expired callback) or cancels one whose rescue collided with a newer unique
duplicate, the application may want to know. Three mechanisms, registered on
one :class:`Hooks` object per kind of job:

* **lifecycle handlers** (:meth:`Hooks.on_event`) observe :class:`JobRescued`
  and :class:`JobCancelled` events. They run *detached* from maintenance: the
  rescue branch only drops the event into a bounded queue; a dispatcher task
  (:meth:`Hooks.run`, started by ``MaintenanceService``) runs each handler in
  its own task, at most ``hook_concurrency`` at once, each cancelled after
  ``hook_timeout``. A slow, failing or hanging handler never delays a
  maintenance pass; when the queue (``hook_queue_size``) is full, events are
  dropped and counted in a warning. Events are in-memory observations (lost
  on shutdown), as with awa-worker's ``on_event``. A plain-function handler runs
  in the dispatcher's Trio thread and cannot be interrupted: keep it quick,
  or make it ``async``.
* **follow-up jobs** (:meth:`Hooks.on_rescued_enqueue`, Awa's ADR-029):
  durable side effects. After a rescue commits, each rescued job's factories
  are asked for :class:`FollowUpJob` s, which are inserted in one transaction
  per rescued job. A failing factory or insert is logged; the rescue stands
  ("no phantom follow-up, possibly a missing one"). Duplicate cancellations
  enqueue nothing (as in Awa).
* **in-flight cancellation** (:attr:`Hooks.in_flight`): an executor running
  jobs in this process registers ``(job_id, run_lease) -> cancel`` while an
  attempt runs; heartbeat and deadline rescues and duplicate cancellations
  call ``cancel`` for exactly that attempt. Callbacks are plain synchronous
  callables (``CancelScope.cancel``, ``Event.set``) run in the maintenance
  task, so they must not block. Registrations are per storage engine
  (``engine="canonical"`` unless said otherwise): canonical and queue-storage
  job ids come from different sequences and collide during a storage
  transition, so a queue-storage rescue of job 7 never cancels canonical
  job 7. Events carry the engine too (``event.job.engine``).

Order for each rescue pass, after the rescue statement has committed:
metrics, in-flight cancellation, follow-up inserts, then events (so a
handler that sees :class:`JobRescued` finds the job's follow-ups committed).

Embedding example::

    from awa_trio import MaintenanceService
    from awa_trio.hooks import FollowUpJob, Hooks, JobRescued

    hooks = Hooks()

    @hooks.on_event("charge_card")
    async def report(event):
        if isinstance(event, JobRescued):
            await alerts.send(f"charge {event.job.id} rescued: {event.reason}")

    hooks.on_rescued_enqueue(
        "charge_card",
        lambda job, reason: FollowUpJob("audit_charge", {"job_id": job.id, "reason": reason}),
    )

    service = MaintenanceService(database_url, hooks=hooks)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        ...

    # In an executor, around one attempt of a job:
    with trio.CancelScope() as attempt_scope:
        with hooks.in_flight.register(job.id, job.run_lease, attempt_scope.cancel):
            await run_job(job)

    # The same for an attempt claimed from queue storage (Awa 0.6's default engine):
    hooks.in_flight.register(job.id, job.run_lease, attempt_scope.cancel, engine="queue_storage")
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .engines.states import INITIAL_ENGINE, job_label
from .jobs import ENGINES, JobRow

if TYPE_CHECKING:
    from .config import MaintenanceConfig

log = logging.getLogger(__name__)

__all__ = [
    "AttemptKey",
    "CancelCallback",
    "EventHandler",
    "FollowUpFactory",
    "FollowUpJob",
    "Hooks",
    "InFlightRegistration",
    "InFlightRegistry",
    "JobCancelled",
    "JobEvent",
    "JobRescued",
    "RescueReason",
]


class RescueReason(enum.StrEnum):
    """Why maintenance rescued a job (the strings of Awa's ``RescueReason::as_str``)."""

    STALE_HEARTBEAT = "stale_heartbeat"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    EXPIRED_CALLBACK = "expired_callback"


@dataclasses.dataclass(frozen=True, slots=True)
class JobRescued:
    """A job was rescued; ``job`` is the committed row (``retryable``, or
    ``failed`` for an expired callback on its last attempt)."""

    job: JobRow
    reason: RescueReason


@dataclasses.dataclass(frozen=True, slots=True)
class JobCancelled:
    """A job was cancelled instead of rescued (or promoted) because another
    job holds its unique claim; ``reason`` is the job's last error text."""

    job: JobRow
    reason: str


JobEvent = JobRescued | JobCancelled
#: Receives one event; may be a plain function or ``async def``.
EventHandler = Callable[[JobEvent], Awaitable[None] | None]
#: Synchronous, non-blocking: called in the maintenance task.
CancelCallback = Callable[[], object]


@dataclasses.dataclass(frozen=True)
class FollowUpJob:
    """A job to insert after a rescue. Nothing is copied from the rescued job:
    put whatever the follow-up needs (its id, the reason) in ``args`` or
    ``metadata``. A ``run_at`` makes it ``scheduled``, else ``available``."""

    kind: str
    #: JSON-serialisable arguments.
    args: Any = dataclasses.field(default_factory=dict)
    _: dataclasses.KW_ONLY
    queue: str = "default"
    priority: int = 2
    max_attempts: int = 25
    run_at: datetime | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tags: Sequence[str] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError("FollowUpJob.kind must be a non-empty string")
        if isinstance(self.tags, str):
            raise TypeError("FollowUpJob.tags must be a sequence of strings, not a string")


#: ``(rescued job, reason) -> follow-up job(s)``; None or an empty list for none.
FollowUpFactory = Callable[[JobRow, RescueReason], FollowUpJob | Iterable[FollowUpJob] | None]

_F = TypeVar("_F", bound=Callable[..., Any])


#: One attempt of one job on one engine: ``(engine, job_id, run_lease)``.
AttemptKey = tuple[str, int, int]


class InFlightRegistration:
    """Handle of one registered attempt; unregister it when the attempt ends
    (or use it as a context manager)."""

    __slots__ = ("_registry", "_token", "engine", "job_id", "run_lease")

    def __init__(self, registry: InFlightRegistry, key: AttemptKey, token: int):
        self.engine, self.job_id, self.run_lease = key
        self._registry = registry
        self._token = token

    def unregister(self) -> None:
        """Idempotent."""
        self._registry._remove((self.engine, self.job_id, self.run_lease), self._token)

    def __enter__(self) -> InFlightRegistration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unregister()


def _attempt_key(engine: str, job_id: int, run_lease: int) -> AttemptKey:
    if engine not in ENGINES:
        raise ValueError(f"unknown storage engine {engine!r} (use one of {', '.join(ENGINES)})")
    return (engine, int(job_id), int(run_lease))


def _describe_attempt(key: AttemptKey) -> str:
    engine, job_id, run_lease = key
    return f"job {job_label(engine, job_id)} (run_lease {run_lease})"


class InFlightRegistry:
    """Attempts running in this process, keyed by ``(engine, job_id, run_lease)``.

    The run lease is bumped at every claim, so a callback registered for an
    earlier attempt of the same job is never called for a later one; the
    engine keeps a canonical job and a queue-storage job with the same id
    apart. ``engine`` defaults to ``"canonical"`` everywhere.
    """

    def __init__(self) -> None:
        self._callbacks: dict[AttemptKey, dict[int, CancelCallback]] = {}
        self._tokens = itertools.count()

    def register(
        self, job_id: int, run_lease: int, cancel: CancelCallback, *, engine: str = INITIAL_ENGINE
    ) -> InFlightRegistration:
        """Call ``cancel()`` if maintenance rescues or cancels this attempt."""
        if not callable(cancel):
            raise TypeError("cancel must be callable")
        key = _attempt_key(engine, job_id, run_lease)
        token = next(self._tokens)
        self._callbacks.setdefault(key, {})[token] = cancel
        return InFlightRegistration(self, key, token)

    def __contains__(self, key: tuple[int, int] | AttemptKey) -> bool:
        """``(job_id, run_lease)`` (canonical) or ``(engine, job_id, run_lease)``."""
        if len(key) == 2:
            key = (INITIAL_ENGINE, *key)
        return key in self._callbacks

    def __len__(self) -> int:
        return len(self._callbacks)

    def _remove(self, key: AttemptKey, token: int) -> None:
        callbacks = self._callbacks.get(key)
        if callbacks is None:
            return
        callbacks.pop(token, None)
        if not callbacks:
            del self._callbacks[key]

    def cancel(
        self, job_id: int, run_lease: int, *, engine: str = INITIAL_ENGINE, errors: list[str] | None = None
    ) -> bool:
        """Call every callback registered for this attempt; True if there was
        one. A failing callback is logged, and its line added to ``errors``."""
        key = _attempt_key(engine, job_id, run_lease)
        callbacks = self._callbacks.get(key)
        if not callbacks:
            return False
        for cancel in list(callbacks.values()):
            try:
                result = cancel()
            except Exception:
                log.exception("hooks: cancel callback for %s failed", _describe_attempt(key))
                if errors is not None:
                    errors.append(f"hooks: cancel callback for {_describe_attempt(key)} failed")
                continue
            if inspect.iscoroutine(result):
                result.close()
                message = "hooks: cancel callback for %s is a coroutine function; cancel callbacks must be synchronous"
                log.error(message, _describe_attempt(key))
                if errors is not None:
                    errors.append(message % _describe_attempt(key))
        return True


class Hooks:
    """Per-kind lifecycle handlers, follow-up factories and the in-flight
    registry of one process. Pass it as ``MaintenanceService(..., hooks=...)``."""

    def __init__(self) -> None:
        self._handlers: dict[str, list[EventHandler]] = {}
        self._follow_up_factories: dict[str, list[FollowUpFactory]] = {}
        #: Running attempts to cancel when maintenance takes their job away.
        self.in_flight = InFlightRegistry()
        self._send: trio.MemorySendChannel[JobEvent] | None = None
        self._dropped_total = 0

    # -- registration (the embedding application) ---------------------------

    def on_event(self, kind: str, handler: EventHandler | None = None) -> Any:
        """Run ``handler(event)`` for every event of a job of ``kind``.
        Handlers stack; usable as ``@hooks.on_event("kind")``."""
        return self._register(self._handlers, kind, handler, "handler")

    def on_rescued_enqueue(self, kind: str, factory: FollowUpFactory | None = None) -> Any:
        """Insert ``factory(job, reason)``'s follow-up jobs whenever a job of
        ``kind`` is rescued. Factories stack; usable as a decorator."""
        return self._register(self._follow_up_factories, kind, factory, "factory")

    @staticmethod
    def _register(table: dict[str, list[Any]], kind: str, fn: Any, what: str) -> Any:
        if not isinstance(kind, str) or not kind:
            raise ValueError("kind must be a non-empty string")

        def add(fn: _F) -> _F:
            if not callable(fn):
                raise TypeError(f"{what} must be callable")
            table.setdefault(kind, []).append(fn)
            return fn

        return add if fn is None else add(fn)

    # -- the dispatcher actor ------------------------------------------------

    @property
    def is_running(self) -> bool:
        """True while :meth:`run` accepts events."""
        return self._send is not None

    def queue_depth(self) -> int:
        """Events waiting for a handler (for /status)."""
        return self._send.statistics().current_buffer_used if self._send is not None else 0

    async def run(
        self, config: MaintenanceConfig, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Dispatch events to handlers until cancelled; running handlers are
        cancelled with it and queued events are dropped."""
        if self._send is not None:
            raise RuntimeError("this Hooks object is already being dispatched by another task")
        send, receive = trio.open_memory_channel[JobEvent](config.hook_queue_size)
        limiter = trio.CapacityLimiter(config.hook_concurrency)
        async with send, receive, trio.open_nursery() as nursery:
            self._send = send
            try:
                task_status.started()
                async for event in receive:
                    for handler in tuple(self._handlers.get(event.job.kind, ())):
                        slot = object()
                        # Waiting here (not in the handler task) bounds the tasks too;
                        # meanwhile events queue in the channel, then get dropped.
                        await limiter.acquire_on_behalf_of(slot)
                        nursery.start_soon(
                            self._run_handler,
                            handler,
                            event,
                            limiter,
                            slot,
                            config.hook_timeout,
                            name=f"hook {type(event).__name__} {event.job.kind} {event.job.label}",
                        )
            finally:
                self._send = None

    async def _run_handler(
        self,
        handler: EventHandler,
        event: JobEvent,
        limiter: trio.CapacityLimiter,
        slot: object,
        timeout: float,
    ) -> None:
        job = event.job
        try:
            with trio.move_on_after(timeout) as scope:
                result = handler(event)
                if inspect.isawaitable(result):
                    await result
            if scope.cancelled_caught:
                log.warning(
                    "hooks: %s handler %s for %s job %s ran longer than hook_timeout (%gs); cancelled",
                    type(event).__name__,
                    _describe(handler),
                    job.kind,
                    job.label,
                    timeout,
                )
        except Exception:
            log.exception(
                "hooks: %s handler %s for %s job %s failed",
                type(event).__name__,
                _describe(handler),
                job.kind,
                job.label,
            )
        finally:
            limiter.release_on_behalf_of(slot)

    # -- used by maintenance branches ---------------------------------------

    def publish(self, events: Iterable[JobEvent]) -> int:
        """Queue events for their handlers without ever waiting; returns how
        many were dropped (queue full, or no dispatcher running)."""
        wanted = [event for event in events if self._handlers.get(event.job.kind)]
        if not wanted:
            return 0
        send = self._send
        if send is None:
            log.debug("hooks: no dispatcher running; dropped %d events", len(wanted))
            return len(wanted)
        dropped = 0
        for event in wanted:
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                dropped += 1
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                log.debug("hooks: dispatcher stopped; dropped %d events", len(wanted))
                return len(wanted)
        if dropped:
            self._dropped_total += dropped
            log.warning(
                "hooks: event queue full (hook_queue_size %d); dropped %d of %d events "
                "(%d dropped since start)",
                send.statistics().max_buffer_size,
                dropped,
                len(wanted),
                self._dropped_total,
            )
        return dropped

    def has_follow_ups(self, kind: str) -> bool:
        return bool(self._follow_up_factories.get(kind))

    def follow_ups_for(self, job: JobRow, reason: RescueReason) -> list[FollowUpJob]:
        """Every registered factory's follow-ups for this rescued job, in
        registration order. Exceptions from factories propagate."""
        follow_ups: list[FollowUpJob] = []
        for factory in self._follow_up_factories.get(job.kind, ()):
            made = factory(job, reason)
            if made is None:
                continue
            if isinstance(made, FollowUpJob):
                follow_ups.append(made)
                continue
            for item in made:
                if not isinstance(item, FollowUpJob):
                    raise TypeError(
                        f"follow-up factory {_describe(factory)} returned {type(item).__name__}, "
                        "expected FollowUpJob"
                    )
                follow_ups.append(item)
        return follow_ups

    def cancel_in_flight(self, jobs: Iterable[JobRow], errors: list[str] | None = None) -> int:
        """Signal attempts of these jobs running in this process (each on its
        own engine); returns how many. Failing callbacks are added to ``errors``."""
        return sum(
            1
            for job in jobs
            if self.in_flight.cancel(job.id, job.run_lease, engine=job.engine, errors=errors)
        )


def _describe(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
