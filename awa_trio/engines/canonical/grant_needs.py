"""What the canonical engine's branches need of the leading role: its job
tables and admin cache in the awa schema (the grants machinery is
:mod:`awa_trio.grants`)."""

from __future__ import annotations

from ..base import (
    DELETE,
    INSERT,
    SELECT,
    TRUNCATE,
    UPDATE,
    USAGE,
    FunctionNeed,
    GrantNeeds,
    SequenceNeed,
    TableNeed,
)

_JOB_TABLE_WHY = "promotion, rescues, cleanup, priority aging, batch operations, cron; status"
_ADMIN_CACHE_WHY = "admin cache, kept by the job-table triggers and the admin metadata branches"
_DIRTY_KEYS_WHY = (
    "dirty admin-cache keys: marked by the job-table triggers, drained by the admin metadata branches"
)

CANONICAL_TABLES = (
    TableNeed("jobs_hot", (SELECT, INSERT, UPDATE, DELETE), _JOB_TABLE_WHY),
    TableNeed("scheduled_jobs", (SELECT, INSERT, UPDATE, DELETE), _JOB_TABLE_WHY),
    # Awa 0.6.1: recompute locks the keys (FOR UPDATE), refresh truncates them.
    TableNeed(
        "admin_dirty_queues",
        (SELECT, INSERT, UPDATE, DELETE, TRUNCATE),
        _DIRTY_KEYS_WHY + " (row locks; refresh truncates)",
        via_awa_functions=True,
    ),
    TableNeed(
        "admin_dirty_kinds",
        (SELECT, INSERT, UPDATE, DELETE, TRUNCATE),
        _DIRTY_KEYS_WHY + " (row locks; refresh truncates)",
        via_awa_functions=True,
    ),
    # Later 0.6 releases mark keys in these instead (plain inserts and deletes).
    TableNeed("admin_dirty_queue_marks", (SELECT, INSERT, DELETE), _DIRTY_KEYS_WHY, via_awa_functions=True),
    TableNeed("admin_dirty_kind_marks", (SELECT, INSERT, DELETE), _DIRTY_KEYS_WHY, via_awa_functions=True),
    TableNeed("queue_state_counts", (SELECT, INSERT, UPDATE, DELETE), _ADMIN_CACHE_WHY + "; queue_stats"),
    TableNeed("job_queue_catalog", (SELECT, INSERT, UPDATE, DELETE), _ADMIN_CACHE_WHY),
    TableNeed("job_kind_catalog", (SELECT, INSERT, UPDATE, DELETE), _ADMIN_CACHE_WHY),
)

CANONICAL_SEQUENCES = (
    SequenceNeed("jobs_id_seq", (USAGE,), "ids of jobs insert_job_compat inserts (cron, follow-ups)"),
)

CANONICAL_FUNCTIONS = (
    FunctionNeed("recompute_dirty_admin_metadata", "recompute_dirty_admin_metadata branch"),
    FunctionNeed("refresh_admin_metadata", "refresh_admin_metadata branch"),
)


GRANTS = GrantNeeds(
    awa_tables=CANONICAL_TABLES,
    awa_sequences=CANONICAL_SEQUENCES,
    awa_functions=CANONICAL_FUNCTIONS,
    storage_schema=None,
)
