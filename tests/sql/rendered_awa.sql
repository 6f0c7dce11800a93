-- Every SQL statement of awa_trio (193 awa_trio.sql.Statement objects), rendered for the
-- queue-storage schema awa: `python -m awa_trio sql --schema awa`.
-- Parameters are shown as PostgreSQL receives them ($1, $2, ...), each header naming
-- them in that order. Statements whose slots name the partitions of one ring slot are
-- shown for slot 0 (of the lease ring where a statement serves both lease and
-- claim rings); their header lists those identifiers. Indentation is trimmed and the
-- closing ';' is added here; the text is otherwise what the code sends.

-- awa_trio.control.RESIGN_NOTICE_SQL
-- parameters: $1 :channel, $2 :holder_pid
SELECT pg_notify($1, 'resign ' || $2::integer);

-- awa_trio.cron.store.ATOMIC_ENQUEUE_SQL
-- parameters: $1 :fire_time, $2 :name, $3 :previous_enqueued_at, $4 :fire_time_text
WITH claimed AS (
    UPDATE awa.cron_jobs
    SET last_enqueued_at = $1, updated_at = now()
    WHERE name = $2
      AND last_enqueued_at IS NOT DISTINCT FROM $3::timestamptz
      AND paused_at IS NULL
    RETURNING name, kind, queue, args, priority, max_attempts, tags, metadata
)
SELECT job.id
FROM claimed
CROSS JOIN LATERAL awa.insert_job_compat(
    claimed.kind,
    claimed.queue,
    claimed.args,
    'available'::awa.job_state,
    claimed.priority,
    claimed.max_attempts,
    NULL,
    claimed.metadata
        || jsonb_build_object('cron_name', claimed.name, 'cron_fire_time', $4::text),
    claimed.tags,
    NULL,
    NULL
) AS job;

-- awa_trio.cron.store.LIST_CRON_JOBS_SQL
SELECT
    name, cron_expr, timezone, kind, queue, args, priority, max_attempts,
    tags, metadata, missed_fire_policy, last_enqueued_at, created_at,
    updated_at, paused_at, paused_by,
    now() AS evaluated_at
FROM awa.cron_jobs
ORDER BY name;

-- awa_trio.cron.store.UPSERT_CRON_JOB_SQL
-- parameters: $1 :name, $2 :cron_expr, $3 :timezone, $4 :kind, $5 :queue, $6 :args, $7 :priority, $8 :max_attempts, $9 :tags, $10 :metadata, $11 :missed_fire_policy
INSERT INTO awa.cron_jobs (
    name, cron_expr, timezone, kind, queue, args, priority, max_attempts,
    tags, metadata, missed_fire_policy
)
VALUES (
    $1, $2, $3, $4, $5, $6, $7, $8,
    $9, $10, $11
)
ON CONFLICT (name) DO UPDATE SET
    cron_expr = EXCLUDED.cron_expr,
    timezone = EXCLUDED.timezone,
    kind = EXCLUDED.kind,
    queue = EXCLUDED.queue,
    args = EXCLUDED.args,
    priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts,
    tags = EXCLUDED.tags,
    metadata = EXCLUDED.metadata,
    missed_fire_policy = EXCLUDED.missed_fire_policy,
    updated_at = now()
RETURNING (xmax = 0) AS inserted;

-- awa_trio.db.database.PID_SQL
SELECT pg_backend_pid();

-- awa_trio.db.lock_holders.EXCLUSIVE_HOLDERS_SQL
SELECT DISTINCT n.nspname, c.relname
FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE l.locktype = 'relation' AND l.granted AND l.mode = 'AccessExclusiveLock'
  AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY 1, 2;

-- awa_trio.demo.CREATE_DEMO_DATABASE_SQL
CREATE DATABASE awa_demo;

-- awa_trio.demo.JOBS_SQL
-- parameters: $1 :queues
SELECT id, kind, state::text AS state, attempt, run_at,
       metadata->>'cron_name' AS cron_name
FROM awa.jobs
WHERE queue = ANY($1::text[])
ORDER BY id;

-- awa_trio.demo.RESCUES_SQL
-- parameters: $1 :queues, $2 :errors
SELECT j.id, j.kind, entry->>'error' AS error, (entry->>'attempt')::int AS attempt,
       (entry->>'at')::timestamptz AS at
FROM awa.jobs AS j, unnest(j.errors) AS entry
WHERE j.queue = ANY($1::text[]) AND entry->>'error' = ANY($2::text[])
ORDER BY at;

-- awa_trio.doctor.DDL_LOCKS_SQL
-- parameters: $1 :schemas, $2 :held_for
SELECT l.pid, a.application_name, a.state, l.mode,
       format('%I.%I', n.nspname, c.relname) AS relation,
       extract(epoch FROM now() - a.xact_start)::float8 AS age
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
  AND n.nspname = ANY($1::text[])
  AND a.xact_start < now() - make_interval(secs => $2)
ORDER BY a.xact_start, relation;

-- awa_trio.doctor.NOTIFY_SQL
-- parameters: $1 :channel
SELECT pg_notify($1, '');

-- awa_trio.doctor.OLDEST_SNAPSHOT_SQL
SELECT pid, application_name, state, backend_xmin::text AS xmin,
       extract(epoch FROM now() - coalesce(xact_start, query_start))::float8 AS age
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND backend_xmin IS NOT NULL
ORDER BY coalesce(xact_start, query_start) NULLS LAST
LIMIT 1;

-- awa_trio.doctor.SERVER_CLOCK_SQL
SELECT extract(epoch FROM clock_timestamp())::float8;

-- awa_trio.doctor.SERVER_SQL
SELECT pg_is_in_recovery() AS in_recovery, current_setting('transaction_read_only') = 'on' AS read_only;

-- awa_trio.doctor.WORKER_RUNTIMES_SQL
SELECT hostname, pid, version
FROM awa.runtime_instances
WHERE last_seen_at > now() - make_interval(secs => greatest(snapshot_interval_ms, 1000) * 3 / 1000.0)
  AND NOT shutting_down
  AND jsonb_typeof(queues) = 'array' AND jsonb_array_length(queues) > 0
ORDER BY hostname, pid;

-- awa_trio.engines.canonical.admin_metadata.RECOMPUTE_DIRTY_ADMIN_METADATA_SQL
-- parameters: $1 :batch_size
SELECT awa.recompute_dirty_admin_metadata($1);

-- awa_trio.engines.canonical.admin_metadata.REFRESH_ADMIN_METADATA_SQL
SELECT awa.refresh_admin_metadata();

-- awa_trio.engines.canonical.batch_operations.APPLY_MOVE_QUEUE_SQL
-- parameters: $1 :operation_id, $2 :queue, $3 :priority, $4 :job_id
    WITH live AS (
        SELECT 1 FROM awa.batch_operations WHERE id = $1 AND state = 'running'
    ),
    hot AS (
        UPDATE awa.jobs_hot AS job
        SET queue = $2::text,
            priority = COALESCE($3::smallint, job.priority),
            metadata = (
                SELECT CASE
                    WHEN with_priority ? '_awa_original_queue' THEN with_priority
                    ELSE jsonb_set(with_priority, '{_awa_original_queue}',
                                   to_jsonb(job.queue), true)
                END
                FROM (
                    SELECT CASE
                        WHEN $3::smallint IS NULL
                             OR job.metadata ? '_awa_original_priority' THEN job.metadata
                        ELSE jsonb_set(job.metadata, '{_awa_original_priority}',
                                       to_jsonb(job.priority), true)
                    END AS with_priority
                ) AS stamped
            )
        WHERE job.id = $4 AND job.state = 'available'
          AND (job.queue <> $2::text
               OR ($3::smallint IS NOT NULL AND job.priority <> $3::smallint))
          AND EXISTS (SELECT 1 FROM live)
        RETURNING job.id, job.queue, job.run_at
),
    deferred AS (
        UPDATE awa.scheduled_jobs AS job
        SET queue = $2::text,
            priority = COALESCE($3::smallint, job.priority),
            metadata = (
                SELECT CASE
                    WHEN with_priority ? '_awa_original_queue' THEN with_priority
                    ELSE jsonb_set(with_priority, '{_awa_original_queue}',
                                   to_jsonb(job.queue), true)
                END
                FROM (
                    SELECT CASE
                        WHEN $3::smallint IS NULL
                             OR job.metadata ? '_awa_original_priority' THEN job.metadata
                        ELSE jsonb_set(job.metadata, '{_awa_original_priority}',
                                       to_jsonb(job.priority), true)
                    END AS with_priority
                ) AS stamped
            )
        WHERE job.id = $4 AND job.state = 'scheduled'
          AND (job.queue <> $2::text
               OR ($3::smallint IS NOT NULL AND job.priority <> $3::smallint))
          AND EXISTS (SELECT 1 FROM live)
        RETURNING job.id, job.queue, job.run_at
),
    changed AS (SELECT id FROM hot UNION ALL SELECT id FROM deferred),
    woken AS (
        SELECT hot.id
        FROM hot, LATERAL pg_notify('awa:' || hot.queue, '') AS notified
        WHERE hot.run_at <= now()
    ),

    outcome AS (
        SELECT CASE WHEN EXISTS (SELECT 1 FROM changed) THEN 'processed' ELSE 'skipped' END
            AS state
    ), item AS (
        UPDATE awa.batch_operation_items AS item
        SET state = outcome.state, error = NULL, processed_at = clock_timestamp()
        FROM outcome
        WHERE item.operation_id = $1 AND item.job_id = $4 AND item.state = 'pending'
        RETURNING item.state
    ), counted AS (
        UPDATE awa.batch_operations AS op
        SET processed = op.processed
                + (SELECT count(*) FROM item WHERE item.state = 'processed'),
            skipped = op.skipped + (SELECT count(*) FROM item WHERE item.state = 'skipped'),
            updated_at = clock_timestamp()
        WHERE op.id = $1
        RETURNING op.state
    )
    SELECT (SELECT state FROM outcome) AS outcome,
           (SELECT state FROM counted) AS operation_state, (SELECT count(*) FROM woken) AS woken;

-- awa_trio.engines.canonical.batch_operations.APPLY_SET_PRIORITY_SQL
-- parameters: $1 :operation_id, $2 :priority, $3 :job_id
    WITH live AS (
        SELECT 1 FROM awa.batch_operations WHERE id = $1 AND state = 'running'
    ),
    hot AS (
        UPDATE awa.jobs_hot AS job
        SET priority = $2::smallint,
            metadata = CASE
                WHEN job.metadata ? '_awa_original_priority' THEN job.metadata
                ELSE jsonb_set(job.metadata, '{_awa_original_priority}',
                               to_jsonb(job.priority), true)
            END
        WHERE job.id = $3 AND job.state = 'available'
          AND job.priority <> $2::smallint
          AND EXISTS (SELECT 1 FROM live)
        RETURNING job.id
),
    deferred AS (
        UPDATE awa.scheduled_jobs AS job
        SET priority = $2::smallint,
            metadata = CASE
                WHEN job.metadata ? '_awa_original_priority' THEN job.metadata
                ELSE jsonb_set(job.metadata, '{_awa_original_priority}',
                               to_jsonb(job.priority), true)
            END
        WHERE job.id = $3 AND job.state = 'scheduled'
          AND job.priority <> $2::smallint
          AND EXISTS (SELECT 1 FROM live)
        RETURNING job.id
),
    changed AS (SELECT id FROM hot UNION ALL SELECT id FROM deferred),

    outcome AS (
        SELECT CASE WHEN EXISTS (SELECT 1 FROM changed) THEN 'processed' ELSE 'skipped' END
            AS state
    ), item AS (
        UPDATE awa.batch_operation_items AS item
        SET state = outcome.state, error = NULL, processed_at = clock_timestamp()
        FROM outcome
        WHERE item.operation_id = $1 AND item.job_id = $3 AND item.state = 'pending'
        RETURNING item.state
    ), counted AS (
        UPDATE awa.batch_operations AS op
        SET processed = op.processed
                + (SELECT count(*) FROM item WHERE item.state = 'processed'),
            skipped = op.skipped + (SELECT count(*) FROM item WHERE item.state = 'skipped'),
            updated_at = clock_timestamp()
        WHERE op.id = $1
        RETURNING op.state
    )
    SELECT (SELECT state FROM outcome) AS outcome,
           (SELECT state FROM counted) AS operation_state;

-- awa_trio.engines.canonical.batch_operations.CLAIM_OPERATION_SQL
-- parameters: $1 :runner_instance
WITH target AS (
    SELECT id, state
    FROM awa.batch_operations
    WHERE state IN ('pending', 'scanning', 'running', 'cancelling')
      AND awa.active_storage_engine() = 'canonical'
    ORDER BY submitted_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE awa.batch_operations AS op
SET state = CASE WHEN target.state = 'pending' THEN 'scanning' ELSE op.state END,
    started_at = COALESCE(op.started_at, clock_timestamp()),
    runner_instance = $1,
    updated_at = clock_timestamp()
FROM target
WHERE op.id = target.id
RETURNING op.id, op.op_kind, op.state, op.spec, op.filter;

-- awa_trio.engines.canonical.batch_operations.SCAN_BOUNDS_SQL
-- parameters: $1 :state, $2 :kind, $3 :queue, $4 :tag, $5 :ids, $6 :created_at_gte, $7 :created_at_lt
    SELECT COALESCE(max(matching.id), 0) AS max_job_id, count(*) AS total_matched
    FROM (
    SELECT job.id
    FROM (
        SELECT id, kind, queue, state, tags, created_at
        FROM awa.jobs_hot
        WHERE state = 'available'
        UNION ALL
        SELECT id, kind, queue, state, tags, created_at
        FROM awa.scheduled_jobs
        WHERE state = 'scheduled'
) AS job
    WHERE ($1::awa.job_state IS NULL OR job.state = $1::awa.job_state)
      AND ($2::text IS NULL OR job.kind = $2::text)
      AND ($3::text IS NULL OR job.queue = $3::text)
      AND ($4::text IS NULL OR job.tags @> ARRAY[$4::text])
      AND ($5::bigint[] IS NULL OR job.id = ANY($5::bigint[]))
      AND ($6::timestamptz IS NULL OR job.created_at >= $6::timestamptz)
      AND ($7::timestamptz IS NULL OR job.created_at < $7::timestamptz)
) AS matching;

-- awa_trio.engines.canonical.batch_operations.SCAN_PAGE_SQL
-- parameters: $1 :state, $2 :kind, $3 :queue, $4 :tag, $5 :ids, $6 :created_at_gte, $7 :created_at_lt, $8 :after_job_id, $9 :max_job_id, $10 :page_size, $11 :operation_id
    WITH page AS (
        SELECT matching.id
        FROM (
    SELECT job.id
    FROM (
        SELECT id, kind, queue, state, tags, created_at
        FROM awa.jobs_hot
        WHERE state = 'available'
        UNION ALL
        SELECT id, kind, queue, state, tags, created_at
        FROM awa.scheduled_jobs
        WHERE state = 'scheduled'
) AS job
    WHERE ($1::awa.job_state IS NULL OR job.state = $1::awa.job_state)
      AND ($2::text IS NULL OR job.kind = $2::text)
      AND ($3::text IS NULL OR job.queue = $3::text)
      AND ($4::text IS NULL OR job.tags @> ARRAY[$4::text])
      AND ($5::bigint[] IS NULL OR job.id = ANY($5::bigint[]))
      AND ($6::timestamptz IS NULL OR job.created_at >= $6::timestamptz)
      AND ($7::timestamptz IS NULL OR job.created_at < $7::timestamptz)
) AS matching
        WHERE matching.id > $8 AND matching.id <= $9
        ORDER BY matching.id
        LIMIT $10
    ), inserted AS (
        INSERT INTO awa.batch_operation_items (operation_id, job_id)
        SELECT $11, page.id FROM page
        ON CONFLICT (operation_id, job_id) DO NOTHING
    )
    SELECT (SELECT max(page.id) FROM page) AS last_job_id,
           (SELECT count(*) FROM page) AS page_jobs,
           (SELECT state FROM awa.batch_operations WHERE id = $11) AS operation_state;

-- awa_trio.engines.canonical.canonical_drain.CANONICAL_PLANE_NOTICES_SQL
-- parameters: $1 :job_ids, $2 :run_leases
SELECT count(pg_notify(
    'awa:cancel',
    jsonb_build_object('job_id', attempt.job_id, 'run_lease', attempt.run_lease)::text
))
FROM unnest($1::bigint[], $2::bigint[]) AS attempt(job_id, run_lease)
WHERE NOT EXISTS (
        SELECT 1 FROM awa.leases AS lease
        WHERE lease.job_id = attempt.job_id AND lease.run_lease = attempt.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.lease_claims AS claims
        WHERE claims.job_id = attempt.job_id AND claims.run_lease = attempt.run_lease
    )
    AND NOT EXISTS (
        SELECT 1
        FROM awa.lease_claim_batches AS claim_batches
        CROSS JOIN LATERAL unnest(claim_batches.job_ids, claim_batches.run_leases)
            AS items(job_id, run_lease)
        WHERE claim_batches.job_ids @> ARRAY[attempt.job_id]
          AND items.job_id = attempt.job_id
          AND items.run_lease = attempt.run_lease
    );

-- awa_trio.engines.canonical.canonical_drain.DEADLINE_SWEEP.batch_sql
-- parameters: $1 :limit, $2 :error
WITH candidates AS (
    SELECT id, attempt >= max_attempts AS exhausted
    FROM awa.jobs_hot
    WHERE state = 'running' AND deadline_at IS NOT NULL AND deadline_at < now()
      ORDER BY deadline_at, id LIMIT $1
    FOR UPDATE SKIP LOCKED
),
failed AS (
    UPDATE awa.jobs_hot AS hot
    SET state = 'failed',
        finalized_at = now(),
        heartbeat_at = NULL,
        deadline_at = NULL,
        callback_id = NULL,
        callback_timeout_at = NULL,
        callback_filter = NULL,
        callback_on_complete = NULL,
        callback_on_fail = NULL,
        callback_transform = NULL,
        errors = hot.errors || jsonb_build_object(
            'error', $2::text, 'attempt', hot.attempt, 'at', now())
    FROM candidates
    WHERE hot.id = candidates.id
      AND candidates.exhausted
    RETURNING hot.id, hot.kind, hot.queue, hot.args, hot.state, hot.priority, hot.attempt, hot.max_attempts, hot.run_at, hot.heartbeat_at, hot.deadline_at, hot.attempted_at, hot.finalized_at, hot.created_at, hot.errors, hot.metadata, hot.tags, hot.unique_key, hot.unique_states, hot.callback_id, hot.callback_timeout_at, hot.callback_filter, hot.callback_on_complete, hot.callback_on_fail, hot.callback_transform, hot.run_lease, hot.progress
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING candidates
    WHERE hot.id = candidates.id
      AND NOT candidates.exhausted
    RETURNING hot.*
),
retried AS (
INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
    run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
    created_at,
    errors || jsonb_build_object('error', $2::text, 'attempt', attempt, 'at', now()) AS errors,
    metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM taken
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress
)
SELECT * FROM failed
UNION ALL
SELECT * FROM retried;

-- awa_trio.engines.canonical.canonical_drain.DEADLINE_SWEEP.candidates_sql
-- parameters: $1 :limit
SELECT id FROM awa.jobs_hot WHERE state = 'running' AND deadline_at IS NOT NULL AND deadline_at < now() ORDER BY deadline_at, id LIMIT $1;

-- awa_trio.engines.canonical.canonical_drain.DEADLINE_SWEEP.one_sql
-- parameters: $1 :job_id, $2 :error
WITH candidates AS (
    SELECT id, attempt >= max_attempts AS exhausted
    FROM awa.jobs_hot
    WHERE state = 'running' AND deadline_at IS NOT NULL AND deadline_at < now()
      AND id = $1
    FOR UPDATE SKIP LOCKED
),
failed AS (
    UPDATE awa.jobs_hot AS hot
    SET state = 'failed',
        finalized_at = now(),
        heartbeat_at = NULL,
        deadline_at = NULL,
        callback_id = NULL,
        callback_timeout_at = NULL,
        callback_filter = NULL,
        callback_on_complete = NULL,
        callback_on_fail = NULL,
        callback_transform = NULL,
        errors = hot.errors || jsonb_build_object(
            'error', $2::text, 'attempt', hot.attempt, 'at', now())
    FROM candidates
    WHERE hot.id = candidates.id
      AND candidates.exhausted
    RETURNING hot.id, hot.kind, hot.queue, hot.args, hot.state, hot.priority, hot.attempt, hot.max_attempts, hot.run_at, hot.heartbeat_at, hot.deadline_at, hot.attempted_at, hot.finalized_at, hot.created_at, hot.errors, hot.metadata, hot.tags, hot.unique_key, hot.unique_states, hot.callback_id, hot.callback_timeout_at, hot.callback_filter, hot.callback_on_complete, hot.callback_on_fail, hot.callback_transform, hot.run_lease, hot.progress
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING candidates
    WHERE hot.id = candidates.id
      AND NOT candidates.exhausted
    RETURNING hot.*
),
retried AS (
INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
    run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
    created_at,
    errors || jsonb_build_object('error', $2::text, 'attempt', attempt, 'at', now()) AS errors,
    metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM taken
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress
)
SELECT * FROM failed
UNION ALL
SELECT * FROM retried;

-- awa_trio.engines.canonical.canonical_drain.DRAIN_STATUS_SQL
-- parameters: $1 :blockers
WITH live_runtime AS (
    SELECT storage_capability, transition_role
    FROM awa.runtime_instances AS runtime
    WHERE runtime.last_seen_at + make_interval(
            secs => GREATEST(((GREATEST(runtime.snapshot_interval_ms, 1000) / 1000) * 3)::int, 30)
          ) >= now()
)
SELECT
    awa.canonical_live_backlog() AS backlog,
    (SELECT count(*) FROM awa.jobs_hot WHERE state = 'available') AS available,
    (SELECT count(*) FROM awa.jobs_hot WHERE state = 'running') AS running,
    (SELECT count(*) FROM awa.jobs_hot WHERE state = 'waiting_external') AS waiting,
    (SELECT count(*) FROM awa.scheduled_jobs) AS deferred,
    (SELECT count(*) FROM awa.scheduled_jobs WHERE run_at <= now()) AS deferred_due,
    (SELECT min(run_at) FROM awa.scheduled_jobs) AS next_due_at,
    (
        SELECT count(*) FROM live_runtime WHERE storage_capability = ANY($1::text[])
    ) AS live_drain_runtimes,
    (
        SELECT count(*) FROM live_runtime
        WHERE storage_capability IN ('canonical', 'canonical_drain_only')
           OR transition_role = 'canonical_drain'
    ) AS canonical_runners;

-- awa_trio.engines.canonical.canonical_drain.HEARTBEAT_SWEEP.batch_sql
-- parameters: $1 :staleness, $2 :limit, $3 :error
WITH candidates AS (
    SELECT id, attempt >= max_attempts AS exhausted
    FROM awa.jobs_hot
    WHERE state = 'running' AND heartbeat_at < now() - make_interval(secs => $1)
      ORDER BY heartbeat_at, id LIMIT $2
    FOR UPDATE SKIP LOCKED
),
failed AS (
    UPDATE awa.jobs_hot AS hot
    SET state = 'failed',
        finalized_at = now(),
        heartbeat_at = NULL,
        deadline_at = NULL,
        callback_id = NULL,
        callback_timeout_at = NULL,
        callback_filter = NULL,
        callback_on_complete = NULL,
        callback_on_fail = NULL,
        callback_transform = NULL,
        errors = hot.errors || jsonb_build_object(
            'error', $3::text, 'attempt', hot.attempt, 'at', now())
    FROM candidates
    WHERE hot.id = candidates.id
      AND candidates.exhausted
    RETURNING hot.id, hot.kind, hot.queue, hot.args, hot.state, hot.priority, hot.attempt, hot.max_attempts, hot.run_at, hot.heartbeat_at, hot.deadline_at, hot.attempted_at, hot.finalized_at, hot.created_at, hot.errors, hot.metadata, hot.tags, hot.unique_key, hot.unique_states, hot.callback_id, hot.callback_timeout_at, hot.callback_filter, hot.callback_on_complete, hot.callback_on_fail, hot.callback_transform, hot.run_lease, hot.progress
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING candidates
    WHERE hot.id = candidates.id
      AND NOT candidates.exhausted
    RETURNING hot.*
),
retried AS (
INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
    run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
    created_at,
    errors || jsonb_build_object('error', $3::text, 'attempt', attempt, 'at', now()) AS errors,
    metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM taken
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress
)
SELECT * FROM failed
UNION ALL
SELECT * FROM retried;

-- awa_trio.engines.canonical.canonical_drain.HEARTBEAT_SWEEP.candidates_sql
-- parameters: $1 :staleness, $2 :limit
SELECT id FROM awa.jobs_hot WHERE state = 'running' AND heartbeat_at < now() - make_interval(secs => $1) ORDER BY heartbeat_at, id LIMIT $2;

-- awa_trio.engines.canonical.canonical_drain.HEARTBEAT_SWEEP.one_sql
-- parameters: $1 :staleness, $2 :job_id, $3 :error
WITH candidates AS (
    SELECT id, attempt >= max_attempts AS exhausted
    FROM awa.jobs_hot
    WHERE state = 'running' AND heartbeat_at < now() - make_interval(secs => $1)
      AND id = $2
    FOR UPDATE SKIP LOCKED
),
failed AS (
    UPDATE awa.jobs_hot AS hot
    SET state = 'failed',
        finalized_at = now(),
        heartbeat_at = NULL,
        deadline_at = NULL,
        callback_id = NULL,
        callback_timeout_at = NULL,
        callback_filter = NULL,
        callback_on_complete = NULL,
        callback_on_fail = NULL,
        callback_transform = NULL,
        errors = hot.errors || jsonb_build_object(
            'error', $3::text, 'attempt', hot.attempt, 'at', now())
    FROM candidates
    WHERE hot.id = candidates.id
      AND candidates.exhausted
    RETURNING hot.id, hot.kind, hot.queue, hot.args, hot.state, hot.priority, hot.attempt, hot.max_attempts, hot.run_at, hot.heartbeat_at, hot.deadline_at, hot.attempted_at, hot.finalized_at, hot.created_at, hot.errors, hot.metadata, hot.tags, hot.unique_key, hot.unique_states, hot.callback_id, hot.callback_timeout_at, hot.callback_filter, hot.callback_on_complete, hot.callback_on_fail, hot.callback_transform, hot.run_lease, hot.progress
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING candidates
    WHERE hot.id = candidates.id
      AND NOT candidates.exhausted
    RETURNING hot.*
),
retried AS (
INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
    run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
    created_at,
    errors || jsonb_build_object('error', $3::text, 'attempt', attempt, 'at', now()) AS errors,
    metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM taken
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress
)
SELECT * FROM failed
UNION ALL
SELECT * FROM retried;

-- awa_trio.engines.canonical.cleanup.DELETE_EXPIRED_JOBS_SQL
-- parameters: $1 :cursor, $2 :queues, $3 :completed_retention, $4 :failed_retention, $5 :limit
WITH picked AS (
    SELECT id, ctid
    FROM awa.jobs_hot
    WHERE ctid > $1::tid
      AND queue <> ALL($2::text[])
      AND ((state = 'completed'
            AND finalized_at < now() - make_interval(secs => $3))
        OR (state IN ('failed', 'cancelled')
            AND finalized_at < now() - make_interval(secs => $4)))
    LIMIT $5
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM awa.jobs_hot AS job
    USING picked
    WHERE job.id = picked.id
    RETURNING 1
)
SELECT
    (SELECT count(*) FROM picked) AS picked,
    (SELECT count(*) FROM deleted) AS deleted,
    (SELECT max(ctid) FROM picked) AS last_picked;

-- awa_trio.engines.canonical.cleanup.DELETE_EXPIRED_QUEUE_JOBS_SQL
-- parameters: $1 :cursor, $2 :queue, $3 :completed_retention, $4 :failed_retention, $5 :limit
WITH picked AS (
    SELECT id, ctid
    FROM awa.jobs_hot
    WHERE ctid > $1::tid
      AND queue = $2
      AND ((state = 'completed'
            AND finalized_at < now() - make_interval(secs => $3))
        OR (state IN ('failed', 'cancelled')
            AND finalized_at < now() - make_interval(secs => $4)))
    LIMIT $5
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM awa.jobs_hot AS job
    USING picked
    WHERE job.id = picked.id
    RETURNING 1
)
SELECT
    (SELECT count(*) FROM picked) AS picked,
    (SELECT count(*) FROM deleted) AS deleted,
    (SELECT max(ctid) FROM picked) AS last_picked;

-- awa_trio.engines.canonical.engine.DUE_COUNTS_SQL
SELECT state::text AS state, count(*) AS jobs,
       extract(epoch FROM now() - min(run_at))::float8 AS oldest_seconds
FROM awa.scheduled_jobs
WHERE state IN ('scheduled', 'retryable') AND run_at <= now()
GROUP BY state ORDER BY state;

-- awa_trio.engines.canonical.engine.RESCUE_BACKLOG_SQL
-- parameters: $1 :staleness
SELECT
    count(*) FILTER (WHERE state = 'running' AND heartbeat_at < now() - make_interval(secs => $1))
        AS stale_heartbeats,
    count(*) FILTER (WHERE state = 'running' AND deadline_at < now()) AS past_deadline,
    count(*) FILTER (WHERE state = 'waiting_external' AND callback_timeout_at < now())
        AS callbacks_timed_out
FROM awa.jobs_hot
WHERE state IN ('running', 'waiting_external');

-- awa_trio.engines.canonical.priority_aging.AGE_WAITING_PRIORITIES_SQL
-- parameters: $1 :priority, $2 :age, $3 :limit
WITH eligible AS (
    SELECT id
    FROM awa.jobs_hot
    WHERE state = 'available'
      AND priority = $1
      AND run_at <= now() - make_interval(secs => $2)
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE awa.jobs_hot AS job
SET priority = job.priority - 1,
    metadata = CASE
        WHEN job.metadata ? '_awa_original_priority' THEN job.metadata
        ELSE job.metadata || jsonb_build_object('_awa_original_priority', job.priority)
    END
FROM eligible
WHERE job.id = eligible.id
RETURNING job.queue;

-- awa_trio.engines.canonical.promote.CANCEL_DUPLICATE_SQL
-- parameters: $1 :job_id, $2 :state, $3 :error
WITH taken AS (
    DELETE FROM awa.scheduled_jobs
    WHERE id = $1
      AND state = $2::awa.job_state
    RETURNING *
)
INSERT INTO awa.jobs_hot (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'cancelled' AS state, priority, attempt, max_attempts,
    run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
    created_at,
    errors || jsonb_build_object('error', $3::text, 'attempt', attempt, 'at', now()) AS errors,
    metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM taken
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress;

-- awa_trio.engines.canonical.promote.DUE_IDS_SQL['retryable']
-- parameters: $1 :limit
SELECT id
FROM awa.scheduled_jobs
WHERE state = 'retryable'::awa.job_state
  AND run_at <= now()
ORDER BY run_at, id
LIMIT $1;

-- awa_trio.engines.canonical.promote.DUE_IDS_SQL['scheduled']
-- parameters: $1 :limit
SELECT id
FROM awa.scheduled_jobs
WHERE state = 'scheduled'::awa.job_state
  AND run_at <= now()
ORDER BY run_at, id
LIMIT $1;

-- awa_trio.engines.canonical.promote.DUE_STATES_SQL
SELECT EXISTS (
    SELECT 1 FROM awa.scheduled_jobs
    WHERE state = 'scheduled'::awa.job_state AND run_at <= now()
) AS scheduled,
EXTRACT(EPOCH FROM (
    SELECT run_at FROM awa.scheduled_jobs
    WHERE state = 'scheduled'::awa.job_state AND run_at > now()
    ORDER BY run_at
    LIMIT 1
) - now())::float8 AS scheduled_next_in,
EXISTS (
    SELECT 1 FROM awa.scheduled_jobs
    WHERE state = 'retryable'::awa.job_state AND run_at <= now()
) AS retryable,
EXTRACT(EPOCH FROM (
    SELECT run_at FROM awa.scheduled_jobs
    WHERE state = 'retryable'::awa.job_state AND run_at > now()
    ORDER BY run_at
    LIMIT 1
) - now())::float8 AS retryable_next_in;

-- awa_trio.engines.canonical.promote.PROMOTE_DUE_SQL['retryable']
-- parameters: $1 :limit
WITH due AS (
    DELETE FROM awa.scheduled_jobs
    WHERE id IN (
        SELECT id
        FROM awa.scheduled_jobs
        WHERE state = 'retryable'::awa.job_state
          AND run_at <= now()
          ORDER BY run_at, id LIMIT $1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING *
),
filed AS (
INSERT INTO awa.jobs_hot (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'available' AS state, priority, attempt, max_attempts,
    CASE WHEN octet_length('awa:' || queue) > 63 THEN now() + interval '1 microsecond'
         ELSE now() END AS run_at,
    NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, finalized_at,
    created_at, errors, metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM due
RETURNING id
)
SELECT due.queue, EXTRACT(EPOCH FROM now() - due.run_at)::float8 AS lateness
FROM due
WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL;

-- awa_trio.engines.canonical.promote.PROMOTE_DUE_SQL['scheduled']
-- parameters: $1 :limit
WITH due AS (
    DELETE FROM awa.scheduled_jobs
    WHERE id IN (
        SELECT id
        FROM awa.scheduled_jobs
        WHERE state = 'scheduled'::awa.job_state
          AND run_at <= now()
          ORDER BY run_at, id LIMIT $1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING *
),
filed AS (
INSERT INTO awa.jobs_hot (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'available' AS state, priority, attempt, max_attempts,
    CASE WHEN octet_length('awa:' || queue) > 63 THEN now() + interval '1 microsecond'
         ELSE now() END AS run_at,
    NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, finalized_at,
    created_at, errors, metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM due
RETURNING id
)
SELECT due.queue, EXTRACT(EPOCH FROM now() - due.run_at)::float8 AS lateness
FROM due
WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL;

-- awa_trio.engines.canonical.promote.PROMOTE_ONE_SQL['retryable']
-- parameters: $1 :job_id
WITH due AS (
    DELETE FROM awa.scheduled_jobs
    WHERE id IN (
        SELECT id
        FROM awa.scheduled_jobs
        WHERE state = 'retryable'::awa.job_state
          AND run_at <= now()
          AND id = $1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING *
),
filed AS (
INSERT INTO awa.jobs_hot (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'available' AS state, priority, attempt, max_attempts,
    CASE WHEN octet_length('awa:' || queue) > 63 THEN now() + interval '1 microsecond'
         ELSE now() END AS run_at,
    NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, finalized_at,
    created_at, errors, metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM due
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress
)
SELECT * FROM filed;

-- awa_trio.engines.canonical.promote.PROMOTE_ONE_SQL['scheduled']
-- parameters: $1 :job_id
WITH due AS (
    DELETE FROM awa.scheduled_jobs
    WHERE id IN (
        SELECT id
        FROM awa.scheduled_jobs
        WHERE state = 'scheduled'::awa.job_state
          AND run_at <= now()
          AND id = $1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING *
),
filed AS (
INSERT INTO awa.jobs_hot (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'available' AS state, priority, attempt, max_attempts,
    CASE WHEN octet_length('awa:' || queue) > 63 THEN now() + interval '1 microsecond'
         ELSE now() END AS run_at,
    NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, finalized_at,
    created_at, errors, metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM due
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress
)
SELECT * FROM filed;

-- awa_trio.engines.canonical.queue_stats.QUEUE_OVERVIEW_SQL
WITH all_queues AS (
    SELECT queue FROM awa.queue_state_counts
    UNION
    SELECT queue FROM awa.queue_descriptors
    UNION
    SELECT queue FROM awa.queue_meta
    UNION
    SELECT descriptor.key
    FROM awa.runtime_instances AS runtime
    CROSS JOIN LATERAL jsonb_each_text(runtime.queue_descriptor_hashes)
        AS descriptor(key, value)
)
SELECT
    q.queue,
    COALESCE(counts.available, 0) AS available,
    COALESCE(counts.running, 0) AS running,
    COALESCE(counts.failed, 0) AS failed,
    COALESCE(counts.scheduled, 0) AS scheduled,
    COALESCE(counts.retryable, 0) AS retryable,
    COALESCE(counts.waiting_external, 0) AS waiting_external,
    lag.lag_seconds
FROM all_queues AS q
LEFT JOIN awa.queue_state_counts AS counts ON counts.queue = q.queue
LEFT JOIN LATERAL (
    SELECT EXTRACT(EPOCH FROM (now() - min(oldest.run_at)))::float8 AS lag_seconds
    FROM generate_series(1, 4) AS level(priority)
    CROSS JOIN LATERAL (
        SELECT job.run_at
        FROM awa.jobs_hot AS job
        WHERE job.state = 'available'
          AND job.queue = q.queue
          AND job.priority = level.priority
        ORDER BY job.run_at
        LIMIT 1
    ) AS oldest
) AS lag ON true
ORDER BY q.queue;

-- awa_trio.engines.canonical.rescue.CANCEL_DUPLICATE_SQL
-- parameters: $1 :error, $2 :job_id, $3 :state
UPDATE awa.jobs_hot
SET state = 'cancelled',
    finalized_at = now(),
    heartbeat_at = NULL,
    deadline_at = NULL,
    callback_id = NULL,
    callback_timeout_at = NULL,
    callback_filter = NULL,
    callback_on_complete = NULL,
    callback_on_fail = NULL,
    callback_transform = NULL,
    errors = errors || jsonb_build_object('error', $1::text, 'attempt', attempt, 'at', now())
WHERE id = $2
  AND state = $3::awa.job_state
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress;

-- awa_trio.engines.canonical.rescue_callbacks.CANDIDATES_SQL
-- parameters: $1 :limit
SELECT id FROM awa.jobs_hot WHERE state = 'waiting_external' AND callback_timeout_at IS NOT NULL AND callback_timeout_at < now() ORDER BY callback_timeout_at, id LIMIT $1;

-- awa_trio.engines.canonical.rescue_callbacks.RESCUE_BATCH_SQL
-- parameters: $1 :limit, $2 :error
WITH expired AS (
    SELECT id, attempt >= max_attempts AS exhausted
    FROM awa.jobs_hot
    WHERE state = 'waiting_external'
      AND callback_timeout_at IS NOT NULL
      AND callback_timeout_at < now()
      ORDER BY callback_timeout_at, id LIMIT $1
    FOR UPDATE SKIP LOCKED
),
failed AS (
    UPDATE awa.jobs_hot AS hot
    SET state = 'failed',
        finalized_at = now(),
        callback_id = NULL,
        callback_timeout_at = NULL,
        callback_filter = NULL,
        callback_on_complete = NULL,
        callback_on_fail = NULL,
        callback_transform = NULL,
        errors = hot.errors || jsonb_build_object(
            'error', $2::text,
            'attempt', hot.attempt,
            'at', now()
        )
    FROM expired
    WHERE hot.id = expired.id
      AND expired.exhausted
    RETURNING hot.id, hot.kind, hot.queue, hot.args, hot.state, hot.priority, hot.attempt, hot.max_attempts, hot.run_at, hot.heartbeat_at, hot.deadline_at, hot.attempted_at, hot.finalized_at, hot.created_at, hot.errors, hot.metadata, hot.tags, hot.unique_key, hot.unique_states, hot.callback_id, hot.callback_timeout_at, hot.callback_filter, hot.callback_on_complete, hot.callback_on_fail, hot.callback_transform, hot.run_lease, hot.progress
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING expired
    WHERE hot.id = expired.id
      AND NOT expired.exhausted
    RETURNING hot.*
),
retried AS (
    INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
    SELECT
        id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
        now() + awa.backoff_duration(attempt, max_attempts) AS run_at,
        heartbeat_at, deadline_at, attempted_at, now() AS finalized_at,
        created_at,
        errors || jsonb_build_object(
            'error', $2::text,
            'attempt', attempt,
            'at', now()
        ) AS errors,
        metadata, tags, unique_key, unique_states,
        NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
        NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
        run_lease, progress
    FROM taken
    RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress
)
SELECT * FROM failed
UNION ALL
SELECT * FROM retried;

-- awa_trio.engines.canonical.rescue_callbacks.RESCUE_ONE_SQL
-- parameters: $1 :job_id, $2 :error
WITH expired AS (
    SELECT id, attempt >= max_attempts AS exhausted
    FROM awa.jobs_hot
    WHERE state = 'waiting_external'
      AND callback_timeout_at IS NOT NULL
      AND callback_timeout_at < now()
      AND id = $1
    FOR UPDATE SKIP LOCKED
),
failed AS (
    UPDATE awa.jobs_hot AS hot
    SET state = 'failed',
        finalized_at = now(),
        callback_id = NULL,
        callback_timeout_at = NULL,
        callback_filter = NULL,
        callback_on_complete = NULL,
        callback_on_fail = NULL,
        callback_transform = NULL,
        errors = hot.errors || jsonb_build_object(
            'error', $2::text,
            'attempt', hot.attempt,
            'at', now()
        )
    FROM expired
    WHERE hot.id = expired.id
      AND expired.exhausted
    RETURNING hot.id, hot.kind, hot.queue, hot.args, hot.state, hot.priority, hot.attempt, hot.max_attempts, hot.run_at, hot.heartbeat_at, hot.deadline_at, hot.attempted_at, hot.finalized_at, hot.created_at, hot.errors, hot.metadata, hot.tags, hot.unique_key, hot.unique_states, hot.callback_id, hot.callback_timeout_at, hot.callback_filter, hot.callback_on_complete, hot.callback_on_fail, hot.callback_transform, hot.run_lease, hot.progress
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING expired
    WHERE hot.id = expired.id
      AND NOT expired.exhausted
    RETURNING hot.*
),
retried AS (
    INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
    SELECT
        id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
        now() + awa.backoff_duration(attempt, max_attempts) AS run_at,
        heartbeat_at, deadline_at, attempted_at, now() AS finalized_at,
        created_at,
        errors || jsonb_build_object(
            'error', $2::text,
            'attempt', attempt,
            'at', now()
        ) AS errors,
        metadata, tags, unique_key, unique_states,
        NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
        NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
        run_lease, progress
    FROM taken
    RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress
)
SELECT * FROM failed
UNION ALL
SELECT * FROM retried;

-- awa_trio.engines.canonical.rescue_deadlines.CANDIDATES_SQL
-- parameters: $1 :limit
SELECT id FROM awa.jobs_hot WHERE state = 'running' AND deadline_at IS NOT NULL AND deadline_at < now() ORDER BY deadline_at, id LIMIT $1;

-- awa_trio.engines.canonical.rescue_deadlines.RESCUE_BATCH_SQL
-- parameters: $1 :limit, $2 :error
WITH candidates AS (
    SELECT id
    FROM awa.jobs_hot
    WHERE state = 'running' AND deadline_at IS NOT NULL AND deadline_at < now()
      ORDER BY deadline_at, id LIMIT $1
    FOR UPDATE SKIP LOCKED
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING candidates
    WHERE hot.id = candidates.id
    RETURNING hot.*
)
INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
    run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
    created_at,
    errors || jsonb_build_object('error', $2::text, 'attempt', attempt, 'at', now()) AS errors,
    metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM taken
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress;

-- awa_trio.engines.canonical.rescue_deadlines.RESCUE_ONE_SQL
-- parameters: $1 :job_id, $2 :error
WITH candidates AS (
    SELECT id
    FROM awa.jobs_hot
    WHERE state = 'running' AND deadline_at IS NOT NULL AND deadline_at < now()
      AND id = $1
    FOR UPDATE SKIP LOCKED
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING candidates
    WHERE hot.id = candidates.id
    RETURNING hot.*
)
INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
    run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
    created_at,
    errors || jsonb_build_object('error', $2::text, 'attempt', attempt, 'at', now()) AS errors,
    metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM taken
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress;

-- awa_trio.engines.canonical.rescue_heartbeats.CANDIDATES_SQL
-- parameters: $1 :staleness, $2 :limit
SELECT id FROM awa.jobs_hot WHERE state = 'running' AND heartbeat_at < now() - make_interval(secs => $1) ORDER BY heartbeat_at, id LIMIT $2;

-- awa_trio.engines.canonical.rescue_heartbeats.RESCUE_BATCH_SQL
-- parameters: $1 :staleness, $2 :limit, $3 :error
WITH candidates AS (
    SELECT id
    FROM awa.jobs_hot
    WHERE state = 'running' AND heartbeat_at < now() - make_interval(secs => $1)
      ORDER BY heartbeat_at, id LIMIT $2
    FOR UPDATE SKIP LOCKED
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING candidates
    WHERE hot.id = candidates.id
    RETURNING hot.*
)
INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
    run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
    created_at,
    errors || jsonb_build_object('error', $3::text, 'attempt', attempt, 'at', now()) AS errors,
    metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM taken
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress;

-- awa_trio.engines.canonical.rescue_heartbeats.RESCUE_ONE_SQL
-- parameters: $1 :staleness, $2 :job_id, $3 :error
WITH candidates AS (
    SELECT id
    FROM awa.jobs_hot
    WHERE state = 'running' AND heartbeat_at < now() - make_interval(secs => $1)
      AND id = $2
    FOR UPDATE SKIP LOCKED
),
taken AS (
    DELETE FROM awa.jobs_hot AS hot
    USING candidates
    WHERE hot.id = candidates.id
    RETURNING hot.*
)
INSERT INTO awa.scheduled_jobs (id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress)
SELECT
    id, kind, queue, args, 'retryable' AS state, priority, attempt, max_attempts,
    run_at, NULL AS heartbeat_at, NULL AS deadline_at, attempted_at, now() AS finalized_at,
    created_at,
    errors || jsonb_build_object('error', $3::text, 'attempt', attempt, 'at', now()) AS errors,
    metadata, tags, unique_key, unique_states,
    NULL AS callback_id, NULL AS callback_timeout_at, NULL AS callback_filter,
    NULL AS callback_on_complete, NULL AS callback_on_fail, NULL AS callback_transform,
    run_lease, progress
FROM taken
RETURNING id, kind, queue, args, state, priority, attempt, max_attempts, run_at, heartbeat_at, deadline_at, attempted_at, finalized_at, created_at, errors, metadata, tags, unique_key, unique_states, callback_id, callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail, callback_transform, run_lease, progress;

-- awa_trio.engines.canonical.unique_claims.CLAIM_HOLDER_SQL
-- parameters: $1 :job_id
SELECT claim.job_id
FROM awa.job_unique_claims AS claim
JOIN (
    SELECT unique_key FROM awa.jobs_hot WHERE id = $1
    UNION ALL
    SELECT unique_key FROM awa.scheduled_jobs WHERE id = $1
) AS job ON claim.unique_key = job.unique_key
WHERE claim.job_id <> $1
LIMIT 1;

-- awa_trio.engines.queue_info.INFO_SQL
WITH status AS (
    SELECT
        state,
        current_engine,
        active_engine,
        prepared_engine,
        COALESCE(NULLIF(details->>'schema', ''), 'awa') AS storage_schema
    FROM awa.storage_status()
),
live_runtime AS (
    SELECT storage_capability, transition_role
    FROM awa.runtime_instances AS runtime
    WHERE runtime.last_seen_at + make_interval(
            secs => GREATEST(3 * GREATEST(runtime.snapshot_interval_ms, 1000), 30000) / 1000.0
          ) >= now()
)
SELECT
    (
        SELECT COALESCE(jsonb_agg(jsonb_build_object(
                   'name', queue, 'display_name', display_name, 'description', description,
                   'owner', owner, 'docs_url', docs_url, 'tags', to_jsonb(tags)
               ) ORDER BY queue), '[]'::jsonb)
        FROM awa.queue_descriptors
    ) AS queues,
    (
        SELECT COALESCE(jsonb_agg(jsonb_build_object(
                   'name', kind, 'display_name', display_name, 'description', description,
                   'owner', owner, 'docs_url', docs_url, 'tags', to_jsonb(tags)
               ) ORDER BY kind), '[]'::jsonb)
        FROM awa.job_kind_descriptors
    ) AS kinds,
    status.state,
    status.current_engine,
    status.active_engine,
    status.prepared_engine,
    CASE
        WHEN status.active_engine = 'queue_storage'
             AND status.state IS DISTINCT FROM 'mixed_transition' THEN NULL
        ELSE awa.canonical_live_backlog()
    END AS canonical_live_backlog,
    status.storage_schema,
    (
        SELECT COALESCE(jsonb_object_agg(capability, live), '{}'::jsonb)
        FROM (
            SELECT storage_capability AS capability, count(*) AS live
            FROM live_runtime
            GROUP BY storage_capability
        ) AS per_capability
    ) AS live_runtime_capability,
    (
        SELECT count(*) FROM live_runtime
        WHERE transition_role = 'queue_storage_target' AND storage_capability = 'queue_storage'
    ) AS live_queue_storage_targets
FROM (SELECT 1) AS always_one_row
LEFT JOIN status ON true;

-- awa_trio.engines.queue_storage.batch_operations.CLAIM_OPERATION_SQL
-- parameters: $1 :runner_instance
WITH target AS (
    SELECT id, state
    FROM awa.batch_operations
    WHERE state IN ('pending', 'scanning', 'running', 'cancelling')
      AND awa.active_storage_engine() = 'queue_storage'
    ORDER BY submitted_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE awa.batch_operations AS op
SET state = CASE WHEN target.state = 'pending' THEN 'scanning' ELSE op.state END,
    started_at = COALESCE(op.started_at, clock_timestamp()),
    runner_instance = $1,
    updated_at = clock_timestamp()
FROM target
WHERE op.id = target.id
RETURNING op.id, op.op_kind, op.state, op.spec, op.filter;

-- awa_trio.engines.queue_storage.batch_operations.ENQUEUE_SHARDS_SQL
-- parameters: $1 :queue
SELECT COALESCE(max(enqueue_shards), 1)::int FROM awa.queue_meta WHERE queue = $1;

-- awa_trio.engines.queue_storage.batch_operations.ENSURE_LANE_SEQUENCES_SQL
-- parameters: $1 :queue, $2 :priority, $3 :shard
SELECT awa.ensure_lane_sequences($1, $2, $3);

-- awa_trio.engines.queue_storage.batch_operations.LANE_LOCK_SQL
-- parameters: $1 :lock_key
SELECT pg_advisory_xact_lock(hashtextextended($1, 0));

-- awa_trio.engines.queue_storage.batch_operations.LIVE_READY_ENTRY_SQL
-- parameters: $1 :job_id
    SELECT ready.ready_slot, ready.ready_generation, ready.queue, ready.priority,
           ready.enqueue_shard, ready.lane_seq
    FROM awa.ready_entries AS ready
    JOIN awa.queue_claim_heads AS claims
      ON claims.queue = ready.queue
     AND claims.priority = ready.priority
     AND claims.enqueue_shard = ready.enqueue_shard
    WHERE ready.job_id = $1
      AND ready.lane_seq >= awa.sequence_next_value(claims.seq_name)
      AND NOT (
    EXISTS (
        SELECT 1 FROM awa.ready_tombstones AS tomb
        WHERE tomb.ready_slot = ready.ready_slot
          AND tomb.ready_generation = ready.ready_generation
          AND tomb.queue = ready.queue
          AND tomb.priority = ready.priority
          AND tomb.enqueue_shard = ready.enqueue_shard
          AND tomb.lane_seq = ready.lane_seq
    )
    OR EXISTS (
        SELECT 1 FROM awa.ready_claim_attempt_batches AS attempts
        WHERE attempts.ready_slot = ready.ready_slot
          AND attempts.ready_generation = ready.ready_generation
          AND attempts.queue = ready.queue
          AND attempts.priority = ready.priority
          AND attempts.enqueue_shard = ready.enqueue_shard
          AND attempts.first_lane_seq <= ready.lane_seq
          AND attempts.next_lane_seq > ready.lane_seq
          AND attempts.lane_ranges @> int8range(ready.lane_seq, ready.lane_seq + 1, '[)')
    )
    OR EXISTS (SELECT 1 FROM awa.lease_claims AS claim
               WHERE claim.job_id = ready.job_id AND claim.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM awa.lease_claim_closures AS closure
               WHERE closure.job_id = ready.job_id AND closure.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM awa.receipt_completion_batches AS receipts
               CROSS JOIN LATERAL unnest(receipts.job_ids, receipts.run_leases) AS done(job_id, run_lease)
               WHERE receipts.job_ids @> ARRAY[ready.job_id]
                 AND done.job_id = ready.job_id AND done.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM awa.leases AS lease
               WHERE lease.job_id = ready.job_id AND lease.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM awa.done_entries AS done
               WHERE done.job_id = ready.job_id AND done.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM awa.deferred_jobs AS deferred
               WHERE deferred.job_id = ready.job_id AND deferred.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM awa.dlq_entries AS dlq
               WHERE dlq.job_id = ready.job_id AND dlq.run_lease = ready.run_lease + 1)
    OR EXISTS (SELECT 1 FROM awa.ready_entries AS later
               WHERE later.job_id = ready.job_id AND later.run_lease = ready.run_lease + 1)
)
    ORDER BY ready.lane_seq DESC
    LIMIT 1
    FOR UPDATE OF ready;

-- awa_trio.engines.queue_storage.batch_operations.LOCK_SOURCE_LANES_SQL
-- parameters: $1 :job_id
SELECT claims.queue, claims.priority, claims.enqueue_shard
FROM awa.queue_claim_heads AS claims
WHERE (claims.queue, claims.priority, claims.enqueue_shard) IN (
    SELECT queue, priority, enqueue_shard FROM awa.ready_entries WHERE job_id = $1
)
ORDER BY claims.queue, claims.priority, claims.enqueue_shard
FOR UPDATE OF claims;

-- awa_trio.engines.queue_storage.batch_operations.OPERATION_STATE_SQL
-- parameters: $1 :operation_id
SELECT state FROM awa.batch_operations WHERE id = $1;

-- awa_trio.engines.queue_storage.batch_operations.RECORD_OUTCOME_SQL
-- parameters: $1 :outcome, $2 :operation_id, $3 :job_id
WITH item AS (
    UPDATE awa.batch_operation_items
    SET state = $1, error = NULL, processed_at = clock_timestamp()
    WHERE operation_id = $2 AND job_id = $3 AND state = 'pending'
    RETURNING state
)
UPDATE awa.batch_operations AS op
SET processed = op.processed + (SELECT count(*) FROM item WHERE state = 'processed'),
    skipped = op.skipped + (SELECT count(*) FROM item WHERE state = 'skipped'),
    updated_at = clock_timestamp()
WHERE op.id = $2
RETURNING op.state AS operation_state;

-- awa_trio.engines.queue_storage.batch_operations.REENTER_READY_SQL
-- parameters: $1 :queue, $2 :priority, $3 :lane_position, $4 :shard, $5 :stamp_queue, $6 :stamp_priority, $7 :ready_slot, $8 :ready_generation, $9 :old_queue, $10 :old_priority, $11 :old_shard, $12 :lane_seq
WITH ring AS (
    SELECT current_slot, generation FROM awa.queue_ring_state WHERE singleton
), moved AS (
    INSERT INTO awa.ready_entries (
        ready_slot, ready_generation, job_id, kind, queue, args, priority, attempt,
        run_lease, max_attempts, lane_seq, enqueue_shard, run_at, attempted_at,
        created_at, unique_key, unique_states, payload
    )
    SELECT ring.current_slot, ring.generation, old.job_id, old.kind, $1, old.args, $2,
           old.attempt, old.run_lease, old.max_attempts, $3::bigint, $4, old.run_at,
           old.attempted_at, old.created_at, old.unique_key, old.unique_states,

jsonb_set(
    COALESCE(old.payload, '{"metadata": {}, "tags": [], "errors": [], "progress": null}'),
    '{metadata}',
    COALESCE(NULLIF(old.payload -> 'metadata', 'null'), '{}')
        || CASE WHEN $5::boolean
                 AND NOT COALESCE(NULLIF(old.payload -> 'metadata', 'null'), '{}')
                         ? '_awa_original_queue'
                THEN jsonb_build_object('_awa_original_queue', old.queue)
                ELSE '{}' END
        || CASE WHEN $6::boolean
                 AND NOT COALESCE(NULLIF(old.payload -> 'metadata', 'null'), '{}')
                         ? '_awa_original_priority'
                THEN jsonb_build_object('_awa_original_priority', old.priority)
                ELSE '{}' END,
    true
)

    FROM ring, awa.ready_entries AS old
    WHERE old.ready_slot = $7 AND old.ready_generation = $8 AND old.queue = $9
      AND old.priority = $10 AND old.enqueue_shard = $11 AND old.lane_seq = $12
    RETURNING ready_slot, ready_generation, queue, priority, enqueue_shard, lane_seq, run_at
), segment AS (
    INSERT INTO awa.ready_segments (
        ready_slot, ready_generation, queue, priority, enqueue_shard,
        first_lane_seq, next_lane_seq, first_run_at
    )
    SELECT ready_slot, ready_generation, queue, priority, enqueue_shard,
           lane_seq, lane_seq + 1, run_at
    FROM moved
    ON CONFLICT DO NOTHING
)
SELECT count(*) AS moved, pg_notify('awa:' || $1, '') AS notified
FROM moved;

-- awa_trio.engines.queue_storage.batch_operations.RESERVE_POSITION_SQL
-- parameters: $1 :queue, $2 :priority, $3 :shard
SELECT awa.reserve_enqueue_seq($1, $2, $3, 1);

-- awa_trio.engines.queue_storage.batch_operations.SCAN_BOUNDS_SQL
-- parameters: $1 :state, $2 :kind, $3 :queue, $4 :tag, $5 :ids, $6 :created_at_gte, $7 :created_at_lt
    SELECT COALESCE(max(matching.id), 0) AS max_job_id, count(*) AS total_matched
    FROM (
    SELECT job.id
    FROM (
        SELECT ready.job_id AS id, ready.kind, ready.queue,
               'available'::awa.job_state AS state,
               awa.queue_storage_payload_tags(ready.payload) AS tags, ready.created_at
        FROM awa.ready_entries AS ready
        JOIN awa.queue_claim_heads AS claims
          ON claims.queue = ready.queue
         AND claims.priority = ready.priority
         AND claims.enqueue_shard = ready.enqueue_shard
        WHERE ready.lane_seq >= awa.sequence_next_value(claims.seq_name)
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones AS tomb
              WHERE tomb.ready_slot = ready.ready_slot
                AND tomb.ready_generation = ready.ready_generation
                AND tomb.queue = ready.queue
                AND tomb.priority = ready.priority
                AND tomb.enqueue_shard = ready.enqueue_shard
                AND tomb.lane_seq = ready.lane_seq
          )
        UNION ALL
        SELECT job_id AS id, kind, queue, state,
               awa.queue_storage_payload_tags(payload) AS tags, created_at
        FROM awa.deferred_jobs
        WHERE state = 'scheduled'
) AS job
    WHERE ($1::awa.job_state IS NULL OR job.state = $1::awa.job_state)
      AND ($2::text IS NULL OR job.kind = $2::text)
      AND ($3::text IS NULL OR job.queue = $3::text)
      AND ($4::text IS NULL OR job.tags @> ARRAY[$4::text])
      AND ($5::bigint[] IS NULL OR job.id = ANY($5::bigint[]))
      AND ($6::timestamptz IS NULL OR job.created_at >= $6::timestamptz)
      AND ($7::timestamptz IS NULL OR job.created_at < $7::timestamptz)
) AS matching;

-- awa_trio.engines.queue_storage.batch_operations.SCAN_PAGE_SQL
-- parameters: $1 :state, $2 :kind, $3 :queue, $4 :tag, $5 :ids, $6 :created_at_gte, $7 :created_at_lt, $8 :after_job_id, $9 :max_job_id, $10 :page_size, $11 :operation_id
    WITH page AS (
        SELECT matching.id
        FROM (
    SELECT job.id
    FROM (
        SELECT ready.job_id AS id, ready.kind, ready.queue,
               'available'::awa.job_state AS state,
               awa.queue_storage_payload_tags(ready.payload) AS tags, ready.created_at
        FROM awa.ready_entries AS ready
        JOIN awa.queue_claim_heads AS claims
          ON claims.queue = ready.queue
         AND claims.priority = ready.priority
         AND claims.enqueue_shard = ready.enqueue_shard
        WHERE ready.lane_seq >= awa.sequence_next_value(claims.seq_name)
          AND NOT EXISTS (
              SELECT 1 FROM awa.ready_tombstones AS tomb
              WHERE tomb.ready_slot = ready.ready_slot
                AND tomb.ready_generation = ready.ready_generation
                AND tomb.queue = ready.queue
                AND tomb.priority = ready.priority
                AND tomb.enqueue_shard = ready.enqueue_shard
                AND tomb.lane_seq = ready.lane_seq
          )
        UNION ALL
        SELECT job_id AS id, kind, queue, state,
               awa.queue_storage_payload_tags(payload) AS tags, created_at
        FROM awa.deferred_jobs
        WHERE state = 'scheduled'
) AS job
    WHERE ($1::awa.job_state IS NULL OR job.state = $1::awa.job_state)
      AND ($2::text IS NULL OR job.kind = $2::text)
      AND ($3::text IS NULL OR job.queue = $3::text)
      AND ($4::text IS NULL OR job.tags @> ARRAY[$4::text])
      AND ($5::bigint[] IS NULL OR job.id = ANY($5::bigint[]))
      AND ($6::timestamptz IS NULL OR job.created_at >= $6::timestamptz)
      AND ($7::timestamptz IS NULL OR job.created_at < $7::timestamptz)
) AS matching
        WHERE matching.id > $8 AND matching.id <= $9
        ORDER BY matching.id
        LIMIT $10
    ), inserted AS (
        INSERT INTO awa.batch_operation_items (operation_id, job_id)
        SELECT $11, page.id FROM page
        ON CONFLICT (operation_id, job_id) DO NOTHING
    )
    SELECT (SELECT max(page.id) FROM page) AS last_job_id,
           (SELECT count(*) FROM page) AS page_jobs,
           (SELECT state FROM awa.batch_operations WHERE id = $11) AS operation_state;

-- awa_trio.engines.queue_storage.batch_operations.TOMBSTONE_AND_ENSURE_LANE_SQL
-- parameters: $1 :ready_slot, $2 :ready_generation, $3 :old_queue, $4 :old_priority, $5 :old_shard, $6 :lane_seq, $7 :job_id, $8 :queue, $9 :priority, $10 :shard
WITH tombstone AS (
    INSERT INTO awa.ready_tombstones (
        ready_slot, ready_generation, queue, priority, enqueue_shard, lane_seq, job_id
    )
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    ON CONFLICT DO NOTHING
    RETURNING 1
), lane AS (
    INSERT INTO awa.queue_lanes (queue, priority)
    VALUES ($8, $9)
    ON CONFLICT DO NOTHING
), enqueue_head AS (
    INSERT INTO awa.queue_enqueue_heads (queue, priority, enqueue_shard)
    VALUES ($8, $9, $10)
    ON CONFLICT DO NOTHING
), claim_head AS (
    INSERT INTO awa.queue_claim_heads (queue, priority, enqueue_shard)
    VALUES ($8, $9, $10)
    ON CONFLICT DO NOTHING
)
SELECT count(*) AS tombstoned FROM tombstone;

-- awa_trio.engines.queue_storage.batch_operations.UPDATE_SCHEDULED_SQL
-- parameters: $1 :queue, $2 :priority, $3 :stamp_queue, $4 :job_id
UPDATE awa.deferred_jobs AS job
SET queue = COALESCE($1::text, job.queue),
    priority = COALESCE($2::smallint, job.priority),
    payload =
jsonb_set(
    COALESCE(job.payload, '{"metadata": {}, "tags": [], "errors": [], "progress": null}'),
    '{metadata}',
    COALESCE(NULLIF(job.payload -> 'metadata', 'null'), '{}')
        || CASE WHEN $3::boolean
                 AND NOT COALESCE(NULLIF(job.payload -> 'metadata', 'null'), '{}')
                         ? '_awa_original_queue'
                THEN jsonb_build_object('_awa_original_queue', job.queue)
                ELSE '{}' END
        || CASE WHEN $2::smallint IS NOT NULL
                 AND NOT COALESCE(NULLIF(job.payload -> 'metadata', 'null'), '{}')
                         ? '_awa_original_priority'
                THEN jsonb_build_object('_awa_original_priority', job.priority)
                ELSE '{}' END,
    true
)

WHERE job.job_id = $4
  AND job.state = 'scheduled'
  AND (job.queue <> COALESCE($1::text, job.queue)
       OR job.priority <> COALESCE($2::smallint, job.priority))
RETURNING job.job_id;

-- awa_trio.engines.queue_storage.cleanup.PURGE_EXPIRED_DLQ_SQL
-- parameters: $1 :retention, $2 :override_queues, $3 :batch_size
DELETE FROM awa.dlq_entries
WHERE job_id IN (
    SELECT job_id
    FROM awa.dlq_entries
    WHERE dlq_at < now() - make_interval(secs => $1)
      AND queue <> ALL($2::text[])
    LIMIT $3
    FOR UPDATE SKIP LOCKED
);

-- awa_trio.engines.queue_storage.cleanup.PURGE_EXPIRED_QUEUE_DLQ_SQL
-- parameters: $1 :queue, $2 :retention, $3 :batch_size
DELETE FROM awa.dlq_entries
WHERE job_id IN (
    SELECT job_id
    FROM awa.dlq_entries
    WHERE queue = $1
      AND dlq_at < now() - make_interval(secs => $2)
    ORDER BY dlq_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
);

-- awa_trio.engines.queue_storage.engine.DUE_COUNTS_SQL
SELECT state::text AS state, count(*) AS jobs,
       extract(epoch FROM now() - min(run_at))::float8 AS oldest_seconds
FROM awa.deferred_jobs
WHERE run_at <= now()
GROUP BY state ORDER BY state;

-- awa_trio.engines.queue_storage.engine.PREPARED_SCHEMA_READY_SQL
-- parameters: $1 :storage_schema
SELECT (
    NOT EXISTS (
        SELECT 1
        FROM unnest(ARRAY[
            'job_id_seq', 'lease_claim_receipt_id_seq', 'lease_claim_batch_id_seq',
            'queue_ring_state', 'ready_entries', 'ready_claim_attempt_batches',
            'ready_tombstones', 'ready_segments', 'done_entries',
            'receipt_completion_batches', 'receipt_completion_tombstones',
            'queue_terminal_count_deltas', 'leases', 'deferred_jobs', 'lease_claims',
            'lease_claim_batches', 'lease_claim_closures', 'lease_claim_closure_batches'
        ]::name[]) AS wanted(relation_name)
        WHERE NOT EXISTS (
            SELECT 1 FROM pg_class AS rel
            JOIN pg_namespace AS nsp ON nsp.oid = rel.relnamespace
            WHERE nsp.nspname = $1
              AND rel.relname = wanted.relation_name
        )
    )
    AND NOT EXISTS (
        SELECT 1
        FROM (VALUES
            ('lease_claim_closure_batches', 'receipt_ranges'),
            ('queue_claim_heads', 'ready_segment_slot'),
            ('queue_claim_heads', 'ready_segment_generation'),
            ('queue_claim_heads', 'ready_segment_next_lane_seq')
        ) AS wanted(table_name, column_name)
        WHERE NOT EXISTS (
            SELECT 1 FROM pg_attribute AS att
            JOIN pg_class AS rel ON rel.oid = att.attrelid
            JOIN pg_namespace AS nsp ON nsp.oid = rel.relnamespace
            WHERE nsp.nspname = $1
              AND rel.relname = wanted.table_name
              AND att.attname = wanted.column_name
              AND att.attnum > 0 AND NOT att.attisdropped
        )
    )
    AND EXISTS (
        SELECT 1 FROM pg_proc AS proc
        JOIN pg_namespace AS nsp ON nsp.oid = proc.pronamespace
        WHERE nsp.nspname = $1
          AND proc.proname = 'claim_ready_runtime'
          AND proc.proargtypes = array_to_string(ARRAY['text', 'int8', 'float8', 'float8']::regtype[]::oid[], ' ')::oidvector
          AND strpos(pg_get_function_result(proc.oid), 'receipt_id') > 0
          AND strpos(pg_get_function_result(proc.oid), 'claim_batch_id') > 0
          AND strpos(pg_get_function_result(proc.oid), 'claim_batch_index') > 0
    )
) AS ready;

-- awa_trio.engines.queue_storage.engine.RESCUE_BACKLOG_SQL
-- parameters: $1 :staleness
SELECT
    count(*) FILTER (WHERE state = 'running' AND heartbeat_at < now() - make_interval(secs => $1))
        AS stale_heartbeats,
    count(*) FILTER (WHERE state = 'running' AND deadline_at < now()) AS past_deadline,
    count(*) FILTER (WHERE state = 'waiting_external' AND callback_timeout_at < now())
        AS callbacks_timed_out
FROM awa.jobs
WHERE state IN ('running', 'waiting_external');

-- awa_trio.engines.queue_storage.layout.RING_SIZES_SQL
SELECT
    (SELECT slot_count FROM awa.queue_ring_state WHERE singleton) AS queue_slots,
    (SELECT slot_count FROM awa.lease_ring_state WHERE singleton) AS lease_slots,
    (SELECT slot_count FROM awa.claim_ring_state WHERE singleton) AS claim_slots;

-- awa_trio.engines.queue_storage.lease_claim_rings.CURRENT_SLOT_SQL
-- identifiers: ring=lease
SELECT current_slot FROM awa.lease_ring_state WHERE singleton;

-- awa_trio.engines.queue_storage.lease_claim_rings.LOCK_CHILDREN_SQL
-- identifiers: children=awa.leases_0
LOCK TABLE awa.leases_0 IN ACCESS EXCLUSIVE MODE;

-- awa_trio.engines.queue_storage.lease_claim_rings.LOCK_CURSOR_SQL
-- identifiers: ring=lease
SELECT current_slot, generation, slot_count
FROM awa.lease_ring_state
WHERE singleton
FOR UPDATE;

-- awa_trio.engines.queue_storage.lease_claim_rings.LOCK_SLOT_ROW_SQL
-- identifiers: ring=lease
-- parameters: $1 :slot
SELECT slot FROM awa.lease_ring_slots WHERE slot = $1 FOR UPDATE;

-- awa_trio.engines.queue_storage.lease_claim_rings.TRUNCATE_CHILDREN_SQL
-- identifiers: children=awa.leases_0
TRUNCATE TABLE awa.leases_0;

-- awa_trio.engines.queue_storage.promote.DUE_IDS_SQL['retryable']
-- parameters: $1 :limit
SELECT deferred.job_id
FROM awa.deferred_jobs AS deferred
WHERE deferred.state = 'retryable'::awa.job_state
  AND deferred.run_at <= now()
  AND NOT EXISTS (
      SELECT 1 FROM awa.queue_meta AS meta
      WHERE meta.queue = deferred.queue AND meta.paused
  )
ORDER BY deferred.run_at, deferred.queue, deferred.priority, deferred.job_id
LIMIT $1;

-- awa_trio.engines.queue_storage.promote.DUE_IDS_SQL['scheduled']
-- parameters: $1 :limit
SELECT deferred.job_id
FROM awa.deferred_jobs AS deferred
WHERE deferred.state = 'scheduled'::awa.job_state
  AND deferred.run_at <= now()
  AND NOT EXISTS (
      SELECT 1 FROM awa.queue_meta AS meta
      WHERE meta.queue = deferred.queue AND meta.paused
  )
ORDER BY deferred.run_at, deferred.queue, deferred.priority, deferred.job_id
LIMIT $1;

-- awa_trio.engines.queue_storage.promote.DUE_STATES_SQL
SELECT EXISTS (
    SELECT 1 FROM awa.deferred_jobs AS deferred
    WHERE deferred.state = 'scheduled'::awa.job_state
      AND deferred.run_at <= now()
      AND deferred.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                       WHERE meta.paused))
) AS scheduled,
EXTRACT(EPOCH FROM (
    SELECT ahead.run_at
    FROM (
        SELECT deferred.run_at, deferred.queue FROM awa.deferred_jobs AS deferred
        WHERE deferred.state = 'scheduled'::awa.job_state AND deferred.run_at > now()
        ORDER BY deferred.run_at
        LIMIT 64
    ) AS ahead
    WHERE ahead.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                    WHERE meta.paused))
    ORDER BY ahead.run_at
    LIMIT 1
) - now())::float8 AS scheduled_next_in,
EXISTS (
    SELECT 1 FROM awa.deferred_jobs AS deferred
    WHERE deferred.state = 'retryable'::awa.job_state
      AND deferred.run_at <= now()
      AND deferred.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                       WHERE meta.paused))
) AS retryable,
EXTRACT(EPOCH FROM (
    SELECT ahead.run_at
    FROM (
        SELECT deferred.run_at, deferred.queue FROM awa.deferred_jobs AS deferred
        WHERE deferred.state = 'retryable'::awa.job_state AND deferred.run_at > now()
        ORDER BY deferred.run_at
        LIMIT 64
    ) AS ahead
    WHERE ahead.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                    WHERE meta.paused))
    ORDER BY ahead.run_at
    LIMIT 1
) - now())::float8 AS retryable_next_in;

-- awa_trio.engines.queue_storage.promote.ENSURE_LANE_SEQUENCES_SQL
-- parameters: $1 :queues, $2 :priorities, $3 :shards
SELECT awa.ensure_lane_sequences(lane.queue, lane.priority, lane.enqueue_shard)
FROM unnest($1::text[], $2::smallint[], $3::smallint[]) AS lane(queue, priority, enqueue_shard);

-- awa_trio.engines.queue_storage.promote.INSERT_CLAIM_HEADS_SQL
-- parameters: $1 :queues, $2 :priorities, $3 :shards
INSERT INTO awa.queue_claim_heads (queue, priority, enqueue_shard)
SELECT lane.queue, lane.priority, lane.enqueue_shard FROM unnest($1::text[], $2::smallint[], $3::smallint[]) AS lane(queue, priority, enqueue_shard)
ON CONFLICT (queue, priority, enqueue_shard) DO NOTHING;

-- awa_trio.engines.queue_storage.promote.INSERT_ENQUEUE_HEADS_SQL
-- parameters: $1 :queues, $2 :priorities, $3 :shards
INSERT INTO awa.queue_enqueue_heads (queue, priority, enqueue_shard)
SELECT lane.queue, lane.priority, lane.enqueue_shard FROM unnest($1::text[], $2::smallint[], $3::smallint[]) AS lane(queue, priority, enqueue_shard)
ON CONFLICT (queue, priority, enqueue_shard) DO NOTHING;

-- awa_trio.engines.queue_storage.promote.INSERT_LANES_SQL
-- parameters: $1 :queues, $2 :priorities, $3 :shards
INSERT INTO awa.queue_lanes (queue, priority)
SELECT DISTINCT lane.queue, lane.priority FROM unnest($1::text[], $2::smallint[], $3::smallint[]) AS lane(queue, priority, enqueue_shard)
ON CONFLICT (queue, priority) DO NOTHING;

-- awa_trio.engines.queue_storage.promote.LOCK_LANES_SQL
-- parameters: $1 :schema_name, $2 :queues, $3 :priorities, $4 :shards
SELECT pg_advisory_xact_lock(hashtextextended(
    $1::text || ':' || lane.queue || ':' || lane.priority || ':' || lane.enqueue_shard, 0))
FROM unnest($2::text[], $3::smallint[], $4::smallint[]) AS lane(queue, priority, enqueue_shard);

-- awa_trio.engines.queue_storage.promote.MISSING_LANES_SQL['retryable']
-- parameters: $1 :limit
WITH due AS (
    SELECT DISTINCT due_row.queue, due_row.priority
    FROM (
        SELECT deferred.queue, deferred.priority
        FROM awa.deferred_jobs AS deferred
        WHERE deferred.state = 'retryable'::awa.job_state
          AND deferred.run_at <= now()
        ORDER BY deferred.run_at
        LIMIT $1
    ) AS due_row
    WHERE NOT EXISTS (
        SELECT 1 FROM awa.queue_meta AS meta
        WHERE meta.queue = due_row.queue AND meta.paused
    )
)
SELECT due.queue, due.priority, shard.enqueue_shard
FROM due
CROSS JOIN LATERAL generate_series(
    0,
    COALESCE(
        (SELECT meta.enqueue_shards FROM awa.queue_meta AS meta
         WHERE meta.queue = due.queue), 1) - 1
) AS shard(enqueue_shard)
WHERE NOT EXISTS (
        SELECT 1 FROM awa.queue_enqueue_heads AS head
        WHERE head.queue = due.queue AND head.priority = due.priority
          AND head.enqueue_shard = shard.enqueue_shard
    )
   OR NOT EXISTS (
        SELECT 1 FROM awa.queue_claim_heads AS head
        WHERE head.queue = due.queue AND head.priority = due.priority
          AND head.enqueue_shard = shard.enqueue_shard
    )
ORDER BY due.queue COLLATE "C", due.priority, shard.enqueue_shard;

-- awa_trio.engines.queue_storage.promote.MISSING_LANES_SQL['scheduled']
-- parameters: $1 :limit
WITH due AS (
    SELECT DISTINCT due_row.queue, due_row.priority
    FROM (
        SELECT deferred.queue, deferred.priority
        FROM awa.deferred_jobs AS deferred
        WHERE deferred.state = 'scheduled'::awa.job_state
          AND deferred.run_at <= now()
        ORDER BY deferred.run_at
        LIMIT $1
    ) AS due_row
    WHERE NOT EXISTS (
        SELECT 1 FROM awa.queue_meta AS meta
        WHERE meta.queue = due_row.queue AND meta.paused
    )
)
SELECT due.queue, due.priority, shard.enqueue_shard
FROM due
CROSS JOIN LATERAL generate_series(
    0,
    COALESCE(
        (SELECT meta.enqueue_shards FROM awa.queue_meta AS meta
         WHERE meta.queue = due.queue), 1) - 1
) AS shard(enqueue_shard)
WHERE NOT EXISTS (
        SELECT 1 FROM awa.queue_enqueue_heads AS head
        WHERE head.queue = due.queue AND head.priority = due.priority
          AND head.enqueue_shard = shard.enqueue_shard
    )
   OR NOT EXISTS (
        SELECT 1 FROM awa.queue_claim_heads AS head
        WHERE head.queue = due.queue AND head.priority = due.priority
          AND head.enqueue_shard = shard.enqueue_shard
    )
ORDER BY due.queue COLLATE "C", due.priority, shard.enqueue_shard;

-- awa_trio.engines.queue_storage.promote.PICK_BATCH_SQL['retryable']
-- parameters: $1 :limit, $2 :shard_rotor
WITH picked AS MATERIALIZED (
    SELECT deferred.job_id, deferred.queue, deferred.priority, deferred.run_at,
           deferred.unique_key, deferred.unique_states
    FROM awa.deferred_jobs AS deferred
    WHERE deferred.state = 'retryable'::awa.job_state
      AND deferred.run_at <= now()
      AND deferred.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                       WHERE meta.paused))
      AND NOT ((deferred.unique_key IS NOT NULL AND COALESCE(substr(deferred.unique_states, 2, 1) = '1', false) AND NOT COALESCE(substr(deferred.unique_states, 5, 1) = '1', false)) AND EXISTS (
          SELECT 1 FROM awa.job_unique_claims AS claim
          WHERE claim.unique_key = deferred.unique_key
            AND claim.job_id <> deferred.job_id
      ))

    ORDER BY deferred.run_at, deferred.queue, deferred.priority, deferred.job_id
    LIMIT $1
    FOR UPDATE OF deferred SKIP LOCKED
),
claimed AS (
    INSERT INTO awa.job_unique_claims (unique_key, job_id)
    SELECT picked.unique_key, picked.job_id
    FROM picked
    WHERE (picked.unique_key IS NOT NULL AND COALESCE(substr(picked.unique_states, 2, 1) = '1', false) AND NOT COALESCE(substr(picked.unique_states, 5, 1) = '1', false))
      AND NOT EXISTS (
          SELECT 1 FROM awa.job_unique_claims AS own
          WHERE own.unique_key = picked.unique_key AND own.job_id = picked.job_id
      )
    RETURNING job_id
),
released AS (
    DELETE FROM awa.job_unique_claims AS claim
    USING picked
    WHERE (picked.unique_key IS NOT NULL AND COALESCE(substr(picked.unique_states, 5, 1) = '1', false) AND NOT COALESCE(substr(picked.unique_states, 2, 1) = '1', false))
      AND claim.unique_key = picked.unique_key
      AND claim.job_id = picked.job_id
    RETURNING claim.job_id
),
lanes AS MATERIALIZED (
    SELECT
        per_lane.queue, per_lane.priority, per_lane.rows, per_lane.job_ids, per_lane.lateness,
        ($2::bigint % COALESCE(
            (SELECT meta.enqueue_shards FROM awa.queue_meta AS meta
             WHERE meta.queue = per_lane.queue), 1))::smallint AS enqueue_shard
    FROM (
        SELECT queue, priority, count(*)::bigint AS rows, array_agg(job_id) AS job_ids,
               array_agg(EXTRACT(EPOCH FROM now() - run_at)::float8) AS lateness
        FROM picked
        GROUP BY queue, priority
    ) AS per_lane
)
SELECT
    lane.queue, lane.priority, lane.enqueue_shard, lane.rows, lane.job_ids, lane.lateness,
    awa.reserve_enqueue_seq(lane.queue, lane.priority, lane.enqueue_shard, lane.rows)
        AS first_seq
FROM (SELECT * FROM lanes ORDER BY queue COLLATE "C", priority, enqueue_shard) AS lane;

-- awa_trio.engines.queue_storage.promote.PICK_BATCH_SQL['scheduled']
-- parameters: $1 :limit, $2 :shard_rotor
WITH picked AS MATERIALIZED (
    SELECT deferred.job_id, deferred.queue, deferred.priority, deferred.run_at,
           deferred.unique_key, deferred.unique_states
    FROM awa.deferred_jobs AS deferred
    WHERE deferred.state = 'scheduled'::awa.job_state
      AND deferred.run_at <= now()
      AND deferred.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                       WHERE meta.paused))
      AND NOT ((deferred.unique_key IS NOT NULL AND COALESCE(substr(deferred.unique_states, 2, 1) = '1', false) AND NOT COALESCE(substr(deferred.unique_states, 1, 1) = '1', false)) AND EXISTS (
          SELECT 1 FROM awa.job_unique_claims AS claim
          WHERE claim.unique_key = deferred.unique_key
            AND claim.job_id <> deferred.job_id
      ))

    ORDER BY deferred.run_at, deferred.queue, deferred.priority, deferred.job_id
    LIMIT $1
    FOR UPDATE OF deferred SKIP LOCKED
),
claimed AS (
    INSERT INTO awa.job_unique_claims (unique_key, job_id)
    SELECT picked.unique_key, picked.job_id
    FROM picked
    WHERE (picked.unique_key IS NOT NULL AND COALESCE(substr(picked.unique_states, 2, 1) = '1', false) AND NOT COALESCE(substr(picked.unique_states, 1, 1) = '1', false))
      AND NOT EXISTS (
          SELECT 1 FROM awa.job_unique_claims AS own
          WHERE own.unique_key = picked.unique_key AND own.job_id = picked.job_id
      )
    RETURNING job_id
),
released AS (
    DELETE FROM awa.job_unique_claims AS claim
    USING picked
    WHERE (picked.unique_key IS NOT NULL AND COALESCE(substr(picked.unique_states, 1, 1) = '1', false) AND NOT COALESCE(substr(picked.unique_states, 2, 1) = '1', false))
      AND claim.unique_key = picked.unique_key
      AND claim.job_id = picked.job_id
    RETURNING claim.job_id
),
lanes AS MATERIALIZED (
    SELECT
        per_lane.queue, per_lane.priority, per_lane.rows, per_lane.job_ids, per_lane.lateness,
        ($2::bigint % COALESCE(
            (SELECT meta.enqueue_shards FROM awa.queue_meta AS meta
             WHERE meta.queue = per_lane.queue), 1))::smallint AS enqueue_shard
    FROM (
        SELECT queue, priority, count(*)::bigint AS rows, array_agg(job_id) AS job_ids,
               array_agg(EXTRACT(EPOCH FROM now() - run_at)::float8) AS lateness
        FROM picked
        GROUP BY queue, priority
    ) AS per_lane
)
SELECT
    lane.queue, lane.priority, lane.enqueue_shard, lane.rows, lane.job_ids, lane.lateness,
    awa.reserve_enqueue_seq(lane.queue, lane.priority, lane.enqueue_shard, lane.rows)
        AS first_seq
FROM (SELECT * FROM lanes ORDER BY queue COLLATE "C", priority, enqueue_shard) AS lane;

-- awa_trio.engines.queue_storage.promote.PICK_ONE_SQL['retryable']
-- parameters: $1 :job_id, $2 :limit, $3 :shard_rotor
WITH picked AS MATERIALIZED (
    SELECT deferred.job_id, deferred.queue, deferred.priority, deferred.run_at,
           deferred.unique_key, deferred.unique_states
    FROM awa.deferred_jobs AS deferred
    WHERE deferred.state = 'retryable'::awa.job_state
      AND deferred.run_at <= now()
      AND deferred.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                       WHERE meta.paused))
      AND NOT ((deferred.unique_key IS NOT NULL AND COALESCE(substr(deferred.unique_states, 2, 1) = '1', false) AND NOT COALESCE(substr(deferred.unique_states, 5, 1) = '1', false)) AND EXISTS (
          SELECT 1 FROM awa.job_unique_claims AS claim
          WHERE claim.unique_key = deferred.unique_key
            AND claim.job_id <> deferred.job_id
      ))
      AND deferred.job_id = $1::bigint
    ORDER BY deferred.run_at, deferred.queue, deferred.priority, deferred.job_id
    LIMIT $2
    FOR UPDATE OF deferred SKIP LOCKED
),
claimed AS (
    INSERT INTO awa.job_unique_claims (unique_key, job_id)
    SELECT picked.unique_key, picked.job_id
    FROM picked
    WHERE (picked.unique_key IS NOT NULL AND COALESCE(substr(picked.unique_states, 2, 1) = '1', false) AND NOT COALESCE(substr(picked.unique_states, 5, 1) = '1', false))
      AND NOT EXISTS (
          SELECT 1 FROM awa.job_unique_claims AS own
          WHERE own.unique_key = picked.unique_key AND own.job_id = picked.job_id
      )
    RETURNING job_id
),
released AS (
    DELETE FROM awa.job_unique_claims AS claim
    USING picked
    WHERE (picked.unique_key IS NOT NULL AND COALESCE(substr(picked.unique_states, 5, 1) = '1', false) AND NOT COALESCE(substr(picked.unique_states, 2, 1) = '1', false))
      AND claim.unique_key = picked.unique_key
      AND claim.job_id = picked.job_id
    RETURNING claim.job_id
),
lanes AS MATERIALIZED (
    SELECT
        per_lane.queue, per_lane.priority, per_lane.rows, per_lane.job_ids, per_lane.lateness,
        ($3::bigint % COALESCE(
            (SELECT meta.enqueue_shards FROM awa.queue_meta AS meta
             WHERE meta.queue = per_lane.queue), 1))::smallint AS enqueue_shard
    FROM (
        SELECT queue, priority, count(*)::bigint AS rows, array_agg(job_id) AS job_ids,
               array_agg(EXTRACT(EPOCH FROM now() - run_at)::float8) AS lateness
        FROM picked
        GROUP BY queue, priority
    ) AS per_lane
)
SELECT
    lane.queue, lane.priority, lane.enqueue_shard, lane.rows, lane.job_ids, lane.lateness,
    awa.reserve_enqueue_seq(lane.queue, lane.priority, lane.enqueue_shard, lane.rows)
        AS first_seq
FROM (SELECT * FROM lanes ORDER BY queue COLLATE "C", priority, enqueue_shard) AS lane;

-- awa_trio.engines.queue_storage.promote.PICK_ONE_SQL['scheduled']
-- parameters: $1 :job_id, $2 :limit, $3 :shard_rotor
WITH picked AS MATERIALIZED (
    SELECT deferred.job_id, deferred.queue, deferred.priority, deferred.run_at,
           deferred.unique_key, deferred.unique_states
    FROM awa.deferred_jobs AS deferred
    WHERE deferred.state = 'scheduled'::awa.job_state
      AND deferred.run_at <= now()
      AND deferred.queue <> ALL (ARRAY(SELECT meta.queue FROM awa.queue_meta AS meta
                                       WHERE meta.paused))
      AND NOT ((deferred.unique_key IS NOT NULL AND COALESCE(substr(deferred.unique_states, 2, 1) = '1', false) AND NOT COALESCE(substr(deferred.unique_states, 1, 1) = '1', false)) AND EXISTS (
          SELECT 1 FROM awa.job_unique_claims AS claim
          WHERE claim.unique_key = deferred.unique_key
            AND claim.job_id <> deferred.job_id
      ))
      AND deferred.job_id = $1::bigint
    ORDER BY deferred.run_at, deferred.queue, deferred.priority, deferred.job_id
    LIMIT $2
    FOR UPDATE OF deferred SKIP LOCKED
),
claimed AS (
    INSERT INTO awa.job_unique_claims (unique_key, job_id)
    SELECT picked.unique_key, picked.job_id
    FROM picked
    WHERE (picked.unique_key IS NOT NULL AND COALESCE(substr(picked.unique_states, 2, 1) = '1', false) AND NOT COALESCE(substr(picked.unique_states, 1, 1) = '1', false))
      AND NOT EXISTS (
          SELECT 1 FROM awa.job_unique_claims AS own
          WHERE own.unique_key = picked.unique_key AND own.job_id = picked.job_id
      )
    RETURNING job_id
),
released AS (
    DELETE FROM awa.job_unique_claims AS claim
    USING picked
    WHERE (picked.unique_key IS NOT NULL AND COALESCE(substr(picked.unique_states, 1, 1) = '1', false) AND NOT COALESCE(substr(picked.unique_states, 2, 1) = '1', false))
      AND claim.unique_key = picked.unique_key
      AND claim.job_id = picked.job_id
    RETURNING claim.job_id
),
lanes AS MATERIALIZED (
    SELECT
        per_lane.queue, per_lane.priority, per_lane.rows, per_lane.job_ids, per_lane.lateness,
        ($3::bigint % COALESCE(
            (SELECT meta.enqueue_shards FROM awa.queue_meta AS meta
             WHERE meta.queue = per_lane.queue), 1))::smallint AS enqueue_shard
    FROM (
        SELECT queue, priority, count(*)::bigint AS rows, array_agg(job_id) AS job_ids,
               array_agg(EXTRACT(EPOCH FROM now() - run_at)::float8) AS lateness
        FROM picked
        GROUP BY queue, priority
    ) AS per_lane
)
SELECT
    lane.queue, lane.priority, lane.enqueue_shard, lane.rows, lane.job_ids, lane.lateness,
    awa.reserve_enqueue_seq(lane.queue, lane.priority, lane.enqueue_shard, lane.rows)
        AS first_seq
FROM (SELECT * FROM lanes ORDER BY queue COLLATE "C", priority, enqueue_shard) AS lane;

-- awa_trio.engines.queue_storage.queue_ring.CARRY_COUNT_DELTAS_SQL
-- identifiers: done_child=awa.done_entries_0
-- parameters: $1 :live_slot, $2 :live_generation, $3 :floor
INSERT INTO awa.queue_terminal_count_deltas (
    ready_slot, ready_generation, queue, priority, enqueue_shard,
    counter_bucket, terminal_delta
)
SELECT $1, $2, queue, priority, enqueue_shard,
       mod(mod(job_id, 256) + 256, 256)::smallint AS bucket,
       count(*)
FROM awa.done_entries_0
WHERE state = 'failed'
  AND finalized_at >= now() - make_interval(secs => $3::double precision)
GROUP BY queue, priority, enqueue_shard, bucket
ORDER BY queue, priority, enqueue_shard, bucket;

-- awa_trio.engines.queue_storage.queue_ring.CARRY_FAILED_ROWS_SQL
-- identifiers: done_child=awa.done_entries_0, ready_child=awa.ready_entries_0
-- parameters: $1 :live_slot, $2 :live_generation, $3 :floor
INSERT INTO awa.done_entries (
    ready_slot, ready_generation, job_id, kind, queue, args, state, priority,
    attempt, run_lease, max_attempts, lane_seq, enqueue_shard, run_at,
    attempted_at, finalized_at, created_at, unique_key, unique_states, payload
)
SELECT
    $1, $2, done.job_id, done.kind, done.queue,
    COALESCE(done.args, ready.args, '{}'::jsonb),
    done.state, done.priority, done.attempt, done.run_lease,
    COALESCE(done.max_attempts, ready.max_attempts, 25::smallint),
    done.lane_seq, done.enqueue_shard,
    COALESCE(done.run_at, ready.run_at, done.finalized_at),
    COALESCE(done.attempted_at, ready.attempted_at),
    done.finalized_at,
    COALESCE(done.created_at, ready.created_at, done.finalized_at),
    COALESCE(done.unique_key, ready.unique_key),
    COALESCE(done.unique_states, ready.unique_states),
    COALESCE(done.payload, ready.payload, '{}'::jsonb)
FROM awa.done_entries_0 AS done
LEFT JOIN awa.ready_entries_0 AS ready
  ON ready.ready_slot = done.ready_slot
 AND ready.ready_generation = done.ready_generation
 AND ready.queue = done.queue
 AND ready.priority = done.priority
 AND ready.enqueue_shard = done.enqueue_shard
 AND ready.lane_seq = done.lane_seq
WHERE done.state = 'failed'
  AND done.finalized_at >= now() - make_interval(secs => $3::double precision);

-- awa_trio.engines.queue_storage.queue_ring.CHILDREN_BUSY_SQL
-- identifiers: claim_attempt_child=awa.ready_claim_attempt_batches_0, delta_child=awa.queue_terminal_count_deltas_0, done_child=awa.done_entries_0, ready_child=awa.ready_entries_0, receipt_batch_child=awa.receipt_completion_batches_0, receipt_tombstone_child=awa.receipt_completion_tombstones_0, segment_child=awa.ready_segments_0, tombstone_child=awa.ready_tombstones_0
SELECT
EXISTS (SELECT 1 FROM awa.ready_entries_0) AS "queue.ready_rows",
EXISTS (SELECT 1 FROM awa.ready_claim_attempt_batches_0) AS "queue.claim_attempt_batches",
EXISTS (SELECT 1 FROM awa.done_entries_0) AS "queue.done_rows",
EXISTS (SELECT 1 FROM awa.ready_tombstones_0) AS "queue.tombstone_rows",
EXISTS (SELECT 1 FROM awa.ready_segments_0) AS "queue.ready_segments",
EXISTS (SELECT 1 FROM awa.receipt_completion_batches_0) AS "queue.receipt_completion_batch_rows",
EXISTS (SELECT 1 FROM awa.receipt_completion_tombstones_0) AS "queue.receipt_completion_tombstone_rows",
EXISTS (SELECT 1 FROM awa.queue_terminal_count_deltas_0) AS "queue.terminal_delta_rows";

-- awa_trio.engines.queue_storage.queue_ring.CURRENT_SLOT_HAS_TRAFFIC_SQL
-- identifiers: ready_child=awa.ready_entries_0
SELECT EXISTS (SELECT 1 FROM awa.ready_entries_0);

-- awa_trio.engines.queue_storage.queue_ring.DELETE_SLOT_LIVE_COUNTS_SQL
-- parameters: $1 :slot
DELETE FROM awa.queue_terminal_live_counts WHERE ready_slot = $1;

-- awa_trio.engines.queue_storage.queue_ring.FOLD_INTO_ROLLUPS_SQL
-- identifiers: done_child=awa.done_entries_0, receipt_batch_child=awa.receipt_completion_batches_0, receipt_tombstone_child=awa.receipt_completion_tombstones_0
-- parameters: $1 :floor_on, $2 :floor
WITH done_counts AS (
    SELECT queue, priority,
           count(*) FILTER (WHERE state <> 'failed') AS completed,
           count(*) FILTER (
               WHERE state = 'failed'
                 AND (NOT $1::boolean
                      OR finalized_at < now() - make_interval(secs => $2::double precision))
           ) AS failed
    FROM awa.done_entries_0
    GROUP BY queue, priority
),
receipt_counts AS (
    SELECT batch.queue, batch.priority, count(*) AS completed
    FROM awa.receipt_completion_batches_0 AS batch
    CROSS JOIN LATERAL unnest(batch.job_ids, batch.run_leases) AS item(job_id, run_lease)
    WHERE NOT EXISTS (
        SELECT 1 FROM awa.receipt_completion_tombstones_0 AS tomb
        WHERE tomb.ready_generation = batch.ready_generation
          AND tomb.job_id = item.job_id
          AND tomb.run_lease = item.run_lease
    )
    GROUP BY batch.queue, batch.priority
),
folded AS (
    SELECT queue, priority,
           (COALESCE(done_counts.completed, 0) + COALESCE(receipt_counts.completed, 0))::bigint
               AS completed,
           COALESCE(done_counts.failed, 0)::bigint AS failed
    FROM done_counts
    FULL JOIN receipt_counts USING (queue, priority)
),
upserted AS (
    INSERT INTO awa.queue_terminal_rollups AS rollups (
        queue, priority, pruned_completed_count, pruned_failed_count
    )
    SELECT queue, priority, completed, failed
    FROM folded
    WHERE completed <> 0 OR failed <> 0
    ORDER BY queue, priority
    ON CONFLICT (queue, priority) DO UPDATE
    SET pruned_completed_count =
            GREATEST(0, rollups.pruned_completed_count + EXCLUDED.pruned_completed_count),
        pruned_failed_count =
            GREATEST(0, rollups.pruned_failed_count + EXCLUDED.pruned_failed_count)
    RETURNING 1
)
SELECT COALESCE(sum(completed), 0)::bigint AS completed,
       COALESCE(sum(failed), 0)::bigint AS failed
FROM folded;

-- awa_trio.engines.queue_storage.queue_ring.LOCK_RING_STATE_SQL
SELECT current_slot, generation, slot_count
FROM awa.queue_ring_state
WHERE singleton
FOR UPDATE;

-- awa_trio.engines.queue_storage.queue_ring.LOCK_SLOT_SQL
-- identifiers: children=awa.ready_entries_0, awa.ready_claim_attempt_batches_0, awa.done_entries_0, awa.ready_tombstones_0, awa.ready_segments_0, awa.receipt_completion_batches_0, awa.receipt_completion_tombstones_0, awa.queue_terminal_count_deltas_0
LOCK TABLE awa.ready_entries_0, awa.ready_claim_attempt_batches_0, awa.done_entries_0, awa.ready_tombstones_0, awa.ready_segments_0, awa.receipt_completion_batches_0, awa.receipt_completion_tombstones_0, awa.queue_terminal_count_deltas_0 IN ACCESS EXCLUSIVE MODE;

-- awa_trio.engines.queue_storage.queue_ring.OLDEST_SEALED_SLOT_SQL
-- parameters: $1 :current_slot
SELECT slot, generation
FROM awa.queue_ring_slots
WHERE generation >= 0 AND slot <> $1
ORDER BY generation, slot
LIMIT 1
FOR UPDATE;

-- awa_trio.engines.queue_storage.queue_ring.OLDEST_SLOT_CLEAN_SQL
-- identifiers: schema_literal='awa'
-- parameters: $1 :current_slot
SELECT oldest.slot,
       pg_relation_size(('awa' || '.ready_entries_' || oldest.slot)::regclass)
         + pg_relation_size(('awa' || '.ready_claim_attempt_batches_' || oldest.slot)::regclass)
         + pg_relation_size(('awa' || '.done_entries_' || oldest.slot)::regclass)
         + pg_relation_size(('awa' || '.ready_tombstones_' || oldest.slot)::regclass)
         + pg_relation_size(('awa' || '.ready_segments_' || oldest.slot)::regclass)
         + pg_relation_size(('awa' || '.receipt_completion_batches_' || oldest.slot)::regclass)
         + pg_relation_size(('awa' || '.receipt_completion_tombstones_' || oldest.slot)::regclass)
         + pg_relation_size(('awa' || '.queue_terminal_count_deltas_' || oldest.slot)::regclass) = 0 AS clean
FROM (
    SELECT slot
    FROM awa.queue_ring_slots
    WHERE generation >= 0 AND slot <> $1
    ORDER BY generation, slot
    LIMIT 1
) AS oldest;

-- awa_trio.engines.queue_storage.queue_ring.ONLY_RETAINED_FAILED_ROWS_SQL
-- identifiers: claim_attempt_child=awa.ready_claim_attempt_batches_0, done_child=awa.done_entries_0, ready_child=awa.ready_entries_0, receipt_batch_child=awa.receipt_completion_batches_0, receipt_tombstone_child=awa.receipt_completion_tombstones_0, segment_child=awa.ready_segments_0, tombstone_child=awa.ready_tombstones_0
-- parameters: $1 :floor, $2 :grace
SELECT
    NOT EXISTS (
        SELECT 1 FROM awa.done_entries_0
        WHERE state <> 'failed'
           OR finalized_at < now() - make_interval(secs => $1::double precision + $2::double precision)
    )
    AND NOT EXISTS (SELECT 1 FROM awa.ready_entries_0)
    AND NOT EXISTS (SELECT 1 FROM awa.ready_claim_attempt_batches_0)
    AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_0)
    AND NOT EXISTS (SELECT 1 FROM awa.ready_segments_0)
    AND NOT EXISTS (SELECT 1 FROM awa.receipt_completion_batches_0)
    AND NOT EXISTS (SELECT 1 FROM awa.receipt_completion_tombstones_0);

-- awa_trio.engines.queue_storage.queue_ring.PRUNE_GATES_SQL
-- identifiers: ready_child=awa.ready_entries_0
-- parameters: $1 :slot, $2 :generation
WITH claim_cursors AS MATERIALIZED (
    SELECT queue, priority, enqueue_shard,
           awa.sequence_next_value(seq_name) AS claim_seq
    FROM awa.queue_claim_heads
)
SELECT
    EXISTS (
        SELECT 1 FROM awa.leases
        WHERE ready_slot = $1 AND ready_generation = $2
    ) AS active_leases,
    EXISTS (
        SELECT 1
        FROM claim_cursors AS cursors
        CROSS JOIN LATERAL (
            SELECT 1 FROM awa.ready_entries_0 AS ready
            WHERE ready.queue = cursors.queue
              AND ready.priority = cursors.priority
              AND ready.enqueue_shard = cursors.enqueue_shard
              AND ready.lane_seq >= cursors.claim_seq
            LIMIT 1
        ) AS unclaimed
    ) AS pending_ready,
    (
        (SELECT count(*) FROM awa.lease_claims
         WHERE ready_slot = $1 AND ready_generation = $2)
      + (SELECT COALESCE(sum(claimed_count), 0) FROM awa.lease_claim_batches
         WHERE ready_slot = $1 AND ready_generation = $2)
    ) <> (
        (SELECT count(*)
         FROM awa.lease_claims AS claims
         JOIN awa.lease_claim_closures AS closures
           ON closures.claim_slot = claims.claim_slot
          AND closures.job_id = claims.job_id
          AND closures.run_lease = claims.run_lease
         WHERE claims.ready_slot = $1 AND claims.ready_generation = $2)
      + (SELECT COALESCE(sum(closed_count), 0) FROM awa.lease_claim_closure_batches
         WHERE ready_slot = $1 AND ready_generation = $2)
    ) AS unclosed_claim_refs;

-- awa_trio.engines.queue_storage.queue_ring.ROTATE_SQL
-- identifiers: schema_literal='awa'
WITH cursor AS (
    SELECT current_slot, generation, slot_count, (current_slot + 1) % slot_count AS next_slot
    FROM awa.queue_ring_state
    WHERE singleton
),
busy AS (
    SELECT (SELECT true FROM awa.ready_entries WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.ready_rows",
           (SELECT true FROM awa.ready_claim_attempt_batches WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.claim_attempt_batches",
           (SELECT true FROM awa.done_entries WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.done_rows",
           (SELECT true FROM awa.ready_tombstones WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.tombstone_rows",
           (SELECT true FROM awa.ready_segments WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.ready_segments",
           (SELECT true FROM awa.receipt_completion_batches WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.receipt_completion_batch_rows",
           (SELECT true FROM awa.receipt_completion_tombstones WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.receipt_completion_tombstone_rows",
           (SELECT true FROM awa.queue_terminal_count_deltas WHERE ready_slot = cursor.next_slot LIMIT 1) IS NOT NULL AS "queue.terminal_delta_rows"
    FROM cursor
),
locked AS (
    SELECT singleton FROM awa.queue_ring_state WHERE singleton FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE awa.queue_ring_state AS state
    SET current_slot = cursor.next_slot, generation = cursor.generation + 1
    FROM cursor, busy, locked
    WHERE state.singleton
      AND state.current_slot = cursor.current_slot
      AND state.generation = cursor.generation
      AND NOT (busy."queue.ready_rows" OR busy."queue.claim_attempt_batches" OR busy."queue.done_rows" OR busy."queue.tombstone_rows" OR busy."queue.ready_segments" OR busy."queue.receipt_completion_batch_rows" OR busy."queue.receipt_completion_tombstone_rows" OR busy."queue.terminal_delta_rows")
    RETURNING state.current_slot, state.generation
),
stamped AS (
    UPDATE awa.queue_ring_slots AS slots
    SET generation = moved.generation
    FROM moved
    WHERE slots.slot = moved.current_slot
),
oldest AS (
    SELECT slots.slot
    FROM awa.queue_ring_slots AS slots, moved
    WHERE slots.generation >= 0 AND slots.slot <> moved.current_slot
    ORDER BY slots.generation, slots.slot
    LIMIT 1
)
SELECT cursor.current_slot, cursor.generation, cursor.slot_count,
       moved.current_slot IS NOT NULL AS moved,
       oldest.slot AS oldest_slot,
       (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname = 'ready_entries_' || oldest.slot)
         + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname = 'ready_claim_attempt_batches_' || oldest.slot)
         + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname = 'done_entries_' || oldest.slot)
         + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname = 'ready_tombstones_' || oldest.slot)
         + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname = 'ready_segments_' || oldest.slot)
         + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname = 'receipt_completion_batches_' || oldest.slot)
         + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname = 'receipt_completion_tombstones_' || oldest.slot)
         + (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname = 'queue_terminal_count_deltas_' || oldest.slot) = 0 AS oldest_clean,
       busy.*
FROM cursor
CROSS JOIN busy
LEFT JOIN moved ON true
LEFT JOIN oldest ON true;

-- awa_trio.engines.queue_storage.queue_ring.SLOT_GENERATION_SQL
-- parameters: $1 :slot
SELECT generation FROM awa.queue_ring_slots WHERE slot = $1;

-- awa_trio.engines.queue_storage.queue_ring.TRUNCATE_SLOT_SQL
-- identifiers: children=awa.ready_entries_0, awa.ready_claim_attempt_batches_0, awa.done_entries_0, awa.ready_tombstones_0, awa.ready_segments_0, awa.receipt_completion_batches_0, awa.receipt_completion_tombstones_0, awa.queue_terminal_count_deltas_0
TRUNCATE TABLE awa.ready_entries_0, awa.ready_claim_attempt_batches_0, awa.done_entries_0, awa.ready_tombstones_0, awa.ready_segments_0, awa.receipt_completion_batches_0, awa.receipt_completion_tombstones_0, awa.queue_terminal_count_deltas_0;

-- awa_trio.engines.queue_storage.queue_stats.CLAIM_RING_SQL
SELECT claims.queue, count(*)::bigint AS running_claims
FROM awa.lease_claims AS claims
WHERE claims.closed_at IS NULL
  AND claims.materialized_at IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM awa.lease_claim_closures AS closures
      WHERE closures.claim_slot = claims.claim_slot
        AND closures.job_id = claims.job_id
        AND closures.run_lease = claims.run_lease
  )
  AND NOT EXISTS (
      SELECT 1 FROM awa.lease_claim_closure_batches AS closure_batches
      WHERE closure_batches.claim_slot = claims.claim_slot
        AND closure_batches.receipt_ranges @> claims.receipt_id
  )
GROUP BY claims.queue;

-- awa_trio.engines.queue_storage.queue_stats.CONTROL_SQL
    WITH
    head_signal AS (
        SELECT
            enqueues.queue,
            enqueues.priority,
            enqueues.enqueue_shard,
            awa.sequence_next_value(enqueues.seq_name) AS next_seq,
            awa.sequence_next_value(claims.seq_name) AS claim_seq
        FROM awa.queue_enqueue_heads AS enqueues
        JOIN awa.queue_claim_heads AS claims
          ON claims.queue = enqueues.queue
         AND claims.priority = enqueues.priority
         AND claims.enqueue_shard = enqueues.enqueue_shard
        WHERE enqueues.seq_name IS NOT NULL AND claims.seq_name IS NOT NULL
    )
,
    queues AS (
        SELECT queue FROM awa.queue_meta
        UNION SELECT queue FROM head_signal
        UNION SELECT queue FROM awa.deferred_jobs
        UNION SELECT queue FROM awa.queue_terminal_live_counts
        UNION SELECT queue FROM awa.queue_terminal_rollups
        UNION SELECT queue FROM awa.dlq_entries
    ),
    ready AS (
        SELECT queue, sum(GREATEST(next_seq - claim_seq, 0))::bigint AS available
        FROM head_signal
        GROUP BY queue
    ),
    deferred AS (
        SELECT
            queue,
            count(*) FILTER (WHERE state = 'scheduled')::bigint AS scheduled,
            count(*) FILTER (WHERE state = 'retryable')::bigint AS retryable
        FROM awa.deferred_jobs
        GROUP BY queue
    ),
    dlq AS (
        SELECT queue, count(*)::bigint AS dlq_depth
        FROM awa.dlq_entries
        GROUP BY queue
    )
    SELECT
        queues.queue,
        COALESCE(ready.available, 0) AS available,
        COALESCE(deferred.scheduled, 0) AS scheduled,
        COALESCE(deferred.retryable, 0) AS retryable,
        COALESCE(dlq.dlq_depth, 0) AS dlq_depth
    FROM queues
    LEFT JOIN ready ON ready.queue = queues.queue
    LEFT JOIN deferred ON deferred.queue = queues.queue
    LEFT JOIN dlq ON dlq.queue = queues.queue
    ORDER BY queues.queue;

-- awa_trio.engines.queue_storage.queue_stats.LEASE_RING_SQL
SELECT
    queue,
    count(*) FILTER (WHERE state = 'running')::bigint AS running,
    count(*) FILTER (WHERE state = 'waiting_external')::bigint AS waiting_external
FROM awa.leases
GROUP BY queue;

-- awa_trio.engines.queue_storage.queue_stats.QUEUE_RING_SQL
    WITH
    head_signal AS (
        SELECT
            enqueues.queue,
            enqueues.priority,
            enqueues.enqueue_shard,
            awa.sequence_next_value(enqueues.seq_name) AS next_seq,
            awa.sequence_next_value(claims.seq_name) AS claim_seq
        FROM awa.queue_enqueue_heads AS enqueues
        JOIN awa.queue_claim_heads AS claims
          ON claims.queue = enqueues.queue
         AND claims.priority = enqueues.priority
         AND claims.enqueue_shard = enqueues.enqueue_shard
        WHERE enqueues.seq_name IS NOT NULL AND claims.seq_name IS NOT NULL
    )
,
    failed_done AS (
        SELECT queue, count(*)::bigint AS failed_done
        FROM awa.done_entries
        WHERE state = 'failed'
        GROUP BY queue
    ),
    lag AS (
        SELECT
            head_signal.queue,
            EXTRACT(EPOCH FROM clock_timestamp() - min(next_ready.run_at))::float8 AS lag_seconds
        FROM head_signal
        CROSS JOIN LATERAL (
            SELECT ready.run_at
            FROM awa.ready_entries AS ready
            WHERE ready.queue = head_signal.queue
              AND ready.priority = head_signal.priority
              AND ready.enqueue_shard = head_signal.enqueue_shard
              AND ready.lane_seq >= head_signal.claim_seq
              AND NOT EXISTS (
                  SELECT 1
                  FROM awa.ready_tombstones AS tomb
                  WHERE tomb.ready_slot = ready.ready_slot
                    AND tomb.ready_generation = ready.ready_generation
                    AND tomb.queue = ready.queue
                    AND tomb.priority = ready.priority
                    AND tomb.enqueue_shard = ready.enqueue_shard
                    AND tomb.lane_seq = ready.lane_seq
              )
            ORDER BY ready.lane_seq
            LIMIT 1
        ) AS next_ready
        WHERE head_signal.next_seq > head_signal.claim_seq
        GROUP BY head_signal.queue
    )
    SELECT
        COALESCE(failed_done.queue, lag.queue) AS queue,
        COALESCE(failed_done.failed_done, 0) AS failed_done,
        lag.lag_seconds
    FROM failed_done
    FULL JOIN lag ON lag.queue = failed_done.queue;

-- awa_trio.engines.queue_storage.rescue_callbacks.TAKE_EXPIRED_CALLBACKS_SQL
-- parameters: $1 :job_ids, $2 :limit, $3 :error
WITH picked AS (
    SELECT lease.lease_slot, lease.queue, lease.priority, lease.enqueue_shard, lease.lane_seq
    FROM awa.leases AS lease
    LEFT JOIN awa.attempt_state AS attempt
      ON attempt.job_id = lease.job_id
     AND attempt.run_lease = lease.run_lease
    WHERE lease.state = 'waiting_external' AND lease.callback_timeout_at IS NOT NULL AND lease.callback_timeout_at < clock_timestamp()
      AND ($1::bigint[] IS NULL OR lease.job_id = ANY($1::bigint[]))
    ORDER BY lease.callback_timeout_at, lease.job_id
    LIMIT $2
    FOR UPDATE OF lease SKIP LOCKED
)
DELETE FROM awa.leases AS lease
USING picked
WHERE lease.lease_slot = picked.lease_slot
  AND lease.queue = picked.queue
  AND lease.priority = picked.priority
  AND lease.enqueue_shard = picked.enqueue_shard
  AND lease.lane_seq = picked.lane_seq
RETURNING
    lease.ready_slot, lease.ready_generation, lease.job_id, lease.queue, lease.state,
    lease.priority, lease.attempt, lease.run_lease, lease.max_attempts, lease.lane_seq,
    lease.enqueue_shard, lease.attempted_at, $3::text AS rescue_error;

-- awa_trio.engines.queue_storage.rescue_deadlines.LOCK_EXPIRED_RECEIPTS_SQL
-- parameters: $1 :job_ids, $2 :limit
    WITH candidates AS MATERIALIZED (
        SELECT claims.claim_slot, claims.job_id, claims.run_lease
        FROM awa.lease_claims AS claims
        WHERE claims.deadline_at IS NOT NULL
          AND claims.deadline_at < clock_timestamp()
          AND claims.closed_at IS NULL
          AND ($1::bigint[] IS NULL OR claims.job_id = ANY($1::bigint[]))
          AND (
    NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closures AS closures
        WHERE closures.claim_slot = claims.claim_slot
          AND closures.job_id = claims.job_id
          AND closures.run_lease = claims.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closure_batches AS closure_batches
        WHERE closure_batches.claim_slot = claims.claim_slot
          AND closure_batches.receipt_ranges @> claims.receipt_id
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.done_entries AS done
        WHERE done.job_id = claims.job_id AND done.run_lease = claims.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.deferred_jobs AS deferred
        WHERE deferred.job_id = claims.job_id AND deferred.run_lease = claims.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.dlq_entries AS dlq
        WHERE dlq.job_id = claims.job_id AND dlq.run_lease = claims.run_lease
    )
)
          AND NOT EXISTS (
              SELECT 1 FROM awa.leases AS lease
              WHERE lease.job_id = claims.job_id AND lease.run_lease = claims.run_lease
          )
        ORDER BY claims.deadline_at, claims.job_id
        LIMIT $2
    )
    SELECT claims.claim_slot, claims.job_id, claims.run_lease
    FROM candidates
    JOIN awa.lease_claims AS claims
      ON claims.claim_slot = candidates.claim_slot
     AND claims.job_id = candidates.job_id
     AND claims.run_lease = candidates.run_lease
    WHERE claims.closed_at IS NULL
      AND pg_catalog.pg_try_advisory_xact_lock(
          pg_catalog.hashtextextended(format('awa.receipt.complete:%s:%s', candidates.job_id, candidates.run_lease), 0))
    FOR UPDATE OF claims SKIP LOCKED;

-- awa_trio.engines.queue_storage.rescue_deadlines.TAKE_EXPIRED_LEASES_SQL
-- parameters: $1 :job_ids, $2 :limit, $3 :error
WITH picked AS (
    SELECT lease.lease_slot, lease.queue, lease.priority, lease.enqueue_shard, lease.lane_seq
    FROM awa.leases AS lease
    LEFT JOIN awa.attempt_state AS attempt
      ON attempt.job_id = lease.job_id
     AND attempt.run_lease = lease.run_lease
    WHERE lease.state = 'running' AND lease.deadline_at IS NOT NULL AND lease.deadline_at < clock_timestamp()
      AND ($1::bigint[] IS NULL OR lease.job_id = ANY($1::bigint[]))
    ORDER BY lease.deadline_at, lease.job_id
    LIMIT $2
    FOR UPDATE OF lease SKIP LOCKED
)
DELETE FROM awa.leases AS lease
USING picked
WHERE lease.lease_slot = picked.lease_slot
  AND lease.queue = picked.queue
  AND lease.priority = picked.priority
  AND lease.enqueue_shard = picked.enqueue_shard
  AND lease.lane_seq = picked.lane_seq
RETURNING
    lease.ready_slot, lease.ready_generation, lease.job_id, lease.queue, lease.state,
    lease.priority, lease.attempt, lease.run_lease, lease.max_attempts, lease.lane_seq,
    lease.enqueue_shard, lease.attempted_at, $3::text AS rescue_error;

-- awa_trio.engines.queue_storage.rescue_heartbeats.LOCK_STALE_RECEIPTS_SQL
-- parameters: $1 :staleness, $2 :job_ids, $3 :limit
    WITH row_candidates AS MATERIALIZED (
        SELECT claims.claim_slot, claims.job_id, claims.run_lease, NULL::bigint AS batch_id,
               COALESCE(attempt.heartbeat_at, claims.claimed_at) AS last_seen
        FROM awa.lease_claims AS claims
        LEFT JOIN awa.attempt_state AS attempt
          ON attempt.job_id = claims.job_id
         AND attempt.run_lease = claims.run_lease
        WHERE claims.closed_at IS NULL
          AND claims.claimed_at < clock_timestamp() - make_interval(secs => $1)
          AND COALESCE(attempt.heartbeat_at, claims.claimed_at) < clock_timestamp() - make_interval(secs => $1)
          AND ($2::bigint[] IS NULL OR claims.job_id = ANY($2::bigint[]))
          AND (
    NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closures AS closures
        WHERE closures.claim_slot = claims.claim_slot
          AND closures.job_id = claims.job_id
          AND closures.run_lease = claims.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closure_batches AS closure_batches
        WHERE closure_batches.claim_slot = claims.claim_slot
          AND closure_batches.receipt_ranges @> claims.receipt_id
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.done_entries AS done
        WHERE done.job_id = claims.job_id AND done.run_lease = claims.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.deferred_jobs AS deferred
        WHERE deferred.job_id = claims.job_id AND deferred.run_lease = claims.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.dlq_entries AS dlq
        WHERE dlq.job_id = claims.job_id AND dlq.run_lease = claims.run_lease
    )
)
          AND NOT EXISTS (
              SELECT 1 FROM awa.leases AS lease
              WHERE lease.job_id = claims.job_id AND lease.run_lease = claims.run_lease
          )
        ORDER BY last_seen, claims.job_id
        LIMIT $3
    ),
    batch_candidates AS MATERIALIZED (
        SELECT claim_batches.claim_slot, items.job_id, items.run_lease, claim_batches.batch_id,
               COALESCE(attempt.heartbeat_at, claim_batches.claimed_at) AS last_seen
        FROM awa.lease_claim_batches AS claim_batches
        CROSS JOIN LATERAL unnest(
            claim_batches.job_ids, claim_batches.run_leases, claim_batches.receipt_ids
        ) AS items(job_id, run_lease, receipt_id)
        LEFT JOIN awa.attempt_state AS attempt
          ON attempt.job_id = items.job_id
         AND attempt.run_lease = items.run_lease
        WHERE claim_batches.claimed_at < clock_timestamp() - make_interval(secs => $1)
          AND COALESCE(attempt.heartbeat_at, claim_batches.claimed_at) < clock_timestamp() - make_interval(secs => $1)
          AND ($2::bigint[] IS NULL OR claim_batches.job_ids && $2::bigint[])
          AND ($2::bigint[] IS NULL OR items.job_id = ANY($2::bigint[]))
          AND (
    NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closures AS closures
        WHERE closures.claim_slot = claim_batches.claim_slot
          AND closures.job_id = items.job_id
          AND closures.run_lease = items.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closure_batches AS closure_batches
        WHERE closure_batches.claim_slot = claim_batches.claim_slot
          AND closure_batches.receipt_ranges @> items.receipt_id
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.done_entries AS done
        WHERE done.job_id = items.job_id AND done.run_lease = items.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.deferred_jobs AS deferred
        WHERE deferred.job_id = items.job_id AND deferred.run_lease = items.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.dlq_entries AS dlq
        WHERE dlq.job_id = items.job_id AND dlq.run_lease = items.run_lease
    )
)
          AND NOT EXISTS (
              SELECT 1 FROM awa.leases AS lease
              WHERE lease.job_id = items.job_id AND lease.run_lease = items.run_lease
          )
        ORDER BY last_seen, items.job_id
        LIMIT $3
    ),
    candidates AS MATERIALIZED (
        SELECT * FROM row_candidates
        UNION ALL
        SELECT * FROM batch_candidates
        ORDER BY last_seen, job_id
        LIMIT $3
    ),
    row_locked AS (
        SELECT claims.claim_slot, claims.job_id, claims.run_lease
        FROM candidates
        JOIN awa.lease_claims AS claims
          ON claims.claim_slot = candidates.claim_slot
         AND claims.job_id = candidates.job_id
         AND claims.run_lease = candidates.run_lease
        WHERE candidates.batch_id IS NULL
          AND claims.closed_at IS NULL
          AND pg_catalog.pg_try_advisory_xact_lock(
              pg_catalog.hashtextextended(format('awa.receipt.complete:%s:%s', candidates.job_id, candidates.run_lease), 0))
        FOR UPDATE OF claims SKIP LOCKED
    ),
    locked_batches AS (
        -- Each compact batch row is locked once, however many of its items are due.
        SELECT claim_batches.claim_slot, claim_batches.batch_id
        FROM awa.lease_claim_batches AS claim_batches
        WHERE (claim_batches.claim_slot, claim_batches.batch_id) IN (
            SELECT claim_slot, batch_id FROM candidates WHERE batch_id IS NOT NULL
        )
        FOR UPDATE SKIP LOCKED
    ),
    batch_locked AS (
        SELECT candidates.claim_slot, candidates.job_id, candidates.run_lease
        FROM candidates
        JOIN locked_batches
          ON locked_batches.claim_slot = candidates.claim_slot
         AND locked_batches.batch_id = candidates.batch_id
        WHERE pg_catalog.pg_try_advisory_xact_lock(
              pg_catalog.hashtextextended(format('awa.receipt.complete:%s:%s', candidates.job_id, candidates.run_lease), 0))
    )
    SELECT claim_slot, job_id, run_lease FROM row_locked
    UNION ALL
    SELECT claim_slot, job_id, run_lease FROM batch_locked;

-- awa_trio.engines.queue_storage.rescue_heartbeats.TAKE_STALE_LEASES_SQL
-- parameters: $1 :staleness, $2 :job_ids, $3 :limit, $4 :error
WITH picked AS (
    SELECT lease.lease_slot, lease.queue, lease.priority, lease.enqueue_shard, lease.lane_seq
    FROM awa.leases AS lease
    LEFT JOIN awa.attempt_state AS attempt
      ON attempt.job_id = lease.job_id
     AND attempt.run_lease = lease.run_lease
    WHERE lease.state = 'running' AND COALESCE(attempt.heartbeat_at, lease.heartbeat_at, lease.attempted_at) < clock_timestamp() - make_interval(secs => $1)
      AND ($2::bigint[] IS NULL OR lease.job_id = ANY($2::bigint[]))
    ORDER BY COALESCE(attempt.heartbeat_at, lease.heartbeat_at, lease.attempted_at), lease.job_id
    LIMIT $3
    FOR UPDATE OF lease SKIP LOCKED
)
DELETE FROM awa.leases AS lease
USING picked
WHERE lease.lease_slot = picked.lease_slot
  AND lease.queue = picked.queue
  AND lease.priority = picked.priority
  AND lease.enqueue_shard = picked.enqueue_shard
  AND lease.lane_seq = picked.lane_seq
RETURNING
    lease.ready_slot, lease.ready_generation, lease.job_id, lease.queue, lease.state,
    lease.priority, lease.attempt, lease.run_lease, lease.max_attempts, lease.lane_seq,
    lease.enqueue_shard, lease.attempted_at, $4::text AS rescue_error;

-- awa_trio.engines.queue_storage.rescue_sql.CLOSE_RECEIPTS_SQL
-- parameters: $1 :claim_slots, $2 :job_ids, $3 :run_leases, $4 :outcome, $5 :error
    WITH locked(claim_slot, job_id, run_lease) AS (
        SELECT * FROM unnest($1::int[], $2::bigint[], $3::bigint[])
    ),
    row_claims AS MATERIALIZED (
        SELECT
            claims.claim_slot, claims.ready_slot, claims.ready_generation, claims.job_id,
            claims.queue, claims.priority, claims.attempt, claims.run_lease,
            claims.max_attempts, claims.lane_seq, claims.enqueue_shard, claims.claimed_at
        FROM locked
        JOIN awa.lease_claims AS claims
          ON claims.claim_slot = locked.claim_slot
         AND claims.job_id = locked.job_id
         AND claims.run_lease = locked.run_lease
        WHERE claims.closed_at IS NULL
          AND (
    NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closures AS closures
        WHERE closures.claim_slot = claims.claim_slot
          AND closures.job_id = claims.job_id
          AND closures.run_lease = claims.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closure_batches AS closure_batches
        WHERE closure_batches.claim_slot = claims.claim_slot
          AND closure_batches.receipt_ranges @> claims.receipt_id
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.done_entries AS done
        WHERE done.job_id = claims.job_id AND done.run_lease = claims.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.deferred_jobs AS deferred
        WHERE deferred.job_id = claims.job_id AND deferred.run_lease = claims.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.dlq_entries AS dlq
        WHERE dlq.job_id = claims.job_id AND dlq.run_lease = claims.run_lease
    )
)
          AND NOT EXISTS (
              SELECT 1 FROM awa.leases AS lease
              WHERE lease.job_id = claims.job_id AND lease.run_lease = claims.run_lease
          )
    ),
    batch_items AS MATERIALIZED (
        -- Each compact batch unnested once (not once per locked attempt).
        SELECT
            claim_batches.claim_slot, claim_batches.ready_slot, claim_batches.ready_generation,
            items.job_id, claim_batches.queue, claim_batches.priority, items.attempt,
            items.run_lease, items.max_attempts, items.lane_seq, claim_batches.enqueue_shard,
            claim_batches.claimed_at, items.receipt_id
        FROM awa.lease_claim_batches AS claim_batches
        CROSS JOIN LATERAL unnest(
            claim_batches.job_ids, claim_batches.run_leases, claim_batches.receipt_ids,
            claim_batches.lane_seqs, claim_batches.attempts, claim_batches.max_attempts
        ) AS items(job_id, run_lease, receipt_id, lane_seq, attempt, max_attempts)
        WHERE claim_batches.claim_slot = ANY($1::int[])
          AND claim_batches.job_ids && $2::bigint[]
    ),
    batch_claims AS MATERIALIZED (
        SELECT batch_items.*
        FROM batch_items
        JOIN locked
          ON locked.claim_slot = batch_items.claim_slot
         AND locked.job_id = batch_items.job_id
         AND locked.run_lease = batch_items.run_lease
        WHERE (
    NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closures AS closures
        WHERE closures.claim_slot = batch_items.claim_slot
          AND closures.job_id = batch_items.job_id
          AND closures.run_lease = batch_items.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.lease_claim_closure_batches AS closure_batches
        WHERE closure_batches.claim_slot = batch_items.claim_slot
          AND closure_batches.receipt_ranges @> batch_items.receipt_id
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.done_entries AS done
        WHERE done.job_id = batch_items.job_id AND done.run_lease = batch_items.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.deferred_jobs AS deferred
        WHERE deferred.job_id = batch_items.job_id AND deferred.run_lease = batch_items.run_lease
    )
    AND NOT EXISTS (
        SELECT 1 FROM awa.dlq_entries AS dlq
        WHERE dlq.job_id = batch_items.job_id AND dlq.run_lease = batch_items.run_lease
    )
)
          AND NOT EXISTS (
              SELECT 1 FROM awa.leases AS lease
              WHERE lease.job_id = batch_items.job_id
                AND lease.run_lease = batch_items.run_lease
          )
    ),
    row_closed AS (
        INSERT INTO awa.lease_claim_closures
            (claim_slot, job_id, run_lease, outcome, closed_at)
        SELECT claim_slot, job_id, run_lease, $4::text, clock_timestamp()
        FROM row_claims
        ON CONFLICT (claim_slot, job_id, run_lease) DO NOTHING
        RETURNING claim_slot, job_id, run_lease, closed_at
    ),
    row_marked AS (
        UPDATE awa.lease_claims AS claims
        SET closed_at = COALESCE(claims.closed_at, row_closed.closed_at)
        FROM row_closed
        WHERE claims.claim_slot = row_closed.claim_slot
          AND claims.job_id = row_closed.job_id
          AND claims.run_lease = row_closed.run_lease
        RETURNING claims.job_id
    ),
    batch_closed AS (
        INSERT INTO awa.lease_claim_closure_batches (
            claim_slot, ready_slot, ready_generation, outcome, closed_count,
            receipt_ids, receipt_ranges, closed_at
        )
        SELECT
            claim_slot, ready_slot, ready_generation, $4::text, count(*)::int,
            array_agg(receipt_id ORDER BY receipt_id),
            range_agg(int8range(receipt_id, receipt_id + 1, '[)') ORDER BY receipt_id),
            clock_timestamp()
        FROM batch_claims
        GROUP BY claim_slot, ready_slot, ready_generation
        RETURNING claim_slot
    )
    SELECT
        row_claims.ready_slot, row_claims.ready_generation, row_claims.job_id, row_claims.queue,
        'running'::awa.job_state AS state, row_claims.priority, row_claims.attempt,
        row_claims.run_lease, row_claims.max_attempts, row_claims.lane_seq,
        row_claims.enqueue_shard, row_claims.claimed_at AS attempted_at,
        $5::text AS rescue_error
    FROM row_claims
    JOIN row_closed
      ON row_closed.claim_slot = row_claims.claim_slot
     AND row_closed.job_id = row_claims.job_id
     AND row_closed.run_lease = row_claims.run_lease
    UNION ALL
    SELECT
        ready_slot, ready_generation, job_id, queue, 'running'::awa.job_state, priority, attempt,
        run_lease, max_attempts, lane_seq, enqueue_shard, claimed_at, $5::text
    FROM batch_claims
    WHERE EXISTS (SELECT 1 FROM batch_closed);

-- awa_trio.engines.queue_storage.rescue_sql.NO_JIT_SQL
SET LOCAL jit = off;

-- awa_trio.engines.queue_storage.rescue_sql.QUEUE_STORAGE_NOTICES_SQL
-- parameters: $1 :job_ids, $2 :run_leases
SELECT count(pg_notify(
    'awa:cancel',
    jsonb_build_object('job_id', attempt.job_id, 'run_lease', attempt.run_lease)::text
))
FROM unnest($1::bigint[], $2::bigint[]) AS attempt(job_id, run_lease)
WHERE NOT EXISTS (
        SELECT 1 FROM awa.jobs_hot AS hot
        WHERE hot.id = attempt.job_id
          AND hot.run_lease = attempt.run_lease
          AND hot.state = 'running'
    );

-- awa_trio.engines.queue_storage.rescue_sql.SETTLE_SQL
-- parameters: $1 :ready_slot, $2 :ready_generation, $3 :job_id, $4 :queue, $5 :state, $6 :priority, $7 :attempt, $8 :run_lease, $9 :max_attempts, $10 :lane_seq, $11 :enqueue_shard, $12 :attempted_at, $13 :rescue_error, $14 :cancel, $15 :exhausts_to_failed, $16 :dlq_queues, $17 :duplicate_error, $18 :dlq_reason
WITH taken AS MATERIALIZED (
    SELECT *
    FROM unnest(
        $1::int[], $2::bigint[], $3::bigint[], $4::text[], $5::awa.job_state[],
        $6::smallint[], $7::smallint[], $8::bigint[], $9::smallint[], $10::bigint[],
        $11::smallint[], $12::timestamptz[], $13::text[]
    ) AS t(
        ready_slot, ready_generation, job_id, queue, old_state, priority, attempt,
        run_lease, max_attempts, lane_seq, enqueue_shard, attempted_at, rescue_error
    )
),
hydrated AS MATERIALIZED (
    SELECT
        taken.*,
        ready.kind, ready.args, ready.run_at, ready.created_at, ready.unique_key,
        ready.unique_states,
        CASE WHEN jsonb_typeof(ready.payload) = 'object' THEN ready.payload
             ELSE '{}'::jsonb END AS base_payload
    FROM taken
    JOIN awa.ready_entries AS ready
      ON ready.ready_slot = taken.ready_slot
     AND ready.ready_generation = taken.ready_generation
     AND ready.queue = taken.queue
     AND ready.enqueue_shard = taken.enqueue_shard
     AND ready.lane_seq = taken.lane_seq
     AND ready.job_id = taken.job_id
),
attempt_rows AS (
    DELETE FROM awa.attempt_state AS attempt
    USING taken
    WHERE attempt.job_id = taken.job_id
      AND attempt.run_lease = taken.run_lease
    RETURNING attempt.job_id, attempt.run_lease, attempt.progress
),
planned AS MATERIALIZED (
    SELECT
        hydrated.*,
        attempt_rows.progress,
        CASE
            WHEN $14::boolean THEN 'cancelled'
            WHEN $15::boolean AND hydrated.attempt >= hydrated.max_attempts THEN
                CASE WHEN hydrated.queue = ANY($16::text[]) THEN 'dlq' ELSE 'failed' END
            ELSE 'retryable'
        END AS target
    FROM hydrated
    LEFT JOIN attempt_rows
      ON attempt_rows.job_id = hydrated.job_id
     AND attempt_rows.run_lease = hydrated.run_lease
),
claiming AS MATERIALIZED (
    SELECT
        planned.*,
        planned.unique_key IS NOT NULL
            AND COALESCE(substr(planned.unique_states, array_position(enum_range(NULL::awa.job_state), (planned.old_state)::awa.job_state), 1) = '1', false) AS old_claims,
        planned.unique_key IS NOT NULL AND planned.target <> 'cancelled'
            AND COALESCE(substr(planned.unique_states, array_position(enum_range(NULL::awa.job_state), (CASE planned.target WHEN 'dlq' THEN 'failed' ELSE planned.target END)::awa.job_state), 1) = '1', false) AS new_claims
    FROM planned
),
wanted AS (
    SELECT DISTINCT ON (unique_key) unique_key, job_id
    FROM claiming
    WHERE new_claims AND NOT old_claims
    ORDER BY unique_key, job_id
),
acquired AS (
    INSERT INTO awa.job_unique_claims AS held (unique_key, job_id)
    SELECT unique_key, job_id FROM wanted
    ON CONFLICT (unique_key) DO UPDATE SET job_id = EXCLUDED.job_id
    WHERE held.job_id = EXCLUDED.job_id
    RETURNING held.job_id
),
settled AS MATERIALIZED (
    SELECT
        claiming.*,
        CASE
            WHEN claiming.new_claims AND NOT claiming.old_claims
                 AND NOT EXISTS (SELECT 1 FROM acquired WHERE acquired.job_id = claiming.job_id)
            THEN 'cancelled'
            ELSE claiming.target
        END AS outcome
    FROM claiming
),
released AS (
    DELETE FROM awa.job_unique_claims AS held
    USING settled
    WHERE settled.old_claims
      AND NOT COALESCE(substr(settled.unique_states, array_position(enum_range(NULL::awa.job_state), (CASE settled.outcome WHEN 'dlq' THEN 'failed' ELSE settled.outcome END)::awa.job_state), 1) = '1', false)
      AND held.unique_key = settled.unique_key
      AND held.job_id = settled.job_id
    RETURNING held.job_id
),
finished AS MATERIALIZED (
    SELECT
        settled.*,
        clock_timestamp() AS settled_at,
        CASE WHEN settled.outcome = 'retryable'
             THEN clock_timestamp()
                  + awa.backoff_duration(settled.attempt, settled.max_attempts)
             ELSE settled.run_at END AS next_run_at,
        CASE WHEN settled.progress IS NULL THEN settled.base_payload
             ELSE jsonb_set(settled.base_payload, '{progress}', settled.progress) END
        || jsonb_build_object(
            'errors',
            CASE WHEN jsonb_typeof(settled.base_payload -> 'errors') = 'array'
                 THEN settled.base_payload -> 'errors' ELSE '[]'::jsonb END
            || jsonb_build_array(
                jsonb_build_object(
                    'error', settled.rescue_error,
                    'attempt', settled.attempt,
                    'at', clock_timestamp()
                )
                || CASE WHEN settled.target IN ('failed', 'dlq')
                        THEN '{"terminal": true}'::jsonb ELSE '{}'::jsonb END
            )
            || CASE WHEN settled.outcome = 'cancelled'
                    THEN jsonb_build_array(jsonb_build_object(
                        'error', $17::text,
                        'attempt', settled.attempt,
                        'at', clock_timestamp(),
                        'terminal', true
                    ))
                    ELSE '[]'::jsonb END
        ) AS payload
    FROM settled
),
receipt_row_closures AS (
    INSERT INTO awa.lease_claim_closures
        (claim_slot, job_id, run_lease, outcome, closed_at)
    SELECT claims.claim_slot, claims.job_id, claims.run_lease, 'rescue',
           clock_timestamp()
    FROM awa.lease_claims AS claims
    JOIN finished
      ON finished.job_id = claims.job_id
     AND finished.run_lease = claims.run_lease
    ON CONFLICT (claim_slot, job_id, run_lease) DO NOTHING
    RETURNING claim_slot, job_id, run_lease, closed_at
),
receipt_rows_marked AS (
    UPDATE awa.lease_claims AS claims
    SET closed_at = COALESCE(claims.closed_at, receipt_row_closures.closed_at)
    FROM receipt_row_closures
    WHERE claims.claim_slot = receipt_row_closures.claim_slot
      AND claims.job_id = receipt_row_closures.job_id
      AND claims.run_lease = receipt_row_closures.run_lease
    RETURNING claims.job_id
),
settled_batch_items AS MATERIALIZED (
    -- Each compact batch holding a settled attempt, unnested once.
    SELECT claim_batches.claim_slot, claim_batches.ready_slot,
           claim_batches.ready_generation, items.job_id, items.run_lease, items.receipt_id
    FROM awa.lease_claim_batches AS claim_batches
    CROSS JOIN LATERAL unnest(
        claim_batches.job_ids, claim_batches.run_leases, claim_batches.receipt_ids
    ) AS items(job_id, run_lease, receipt_id)
    WHERE claim_batches.job_ids && $3::bigint[]
),
open_batch_items AS (
    SELECT items.claim_slot, items.ready_slot, items.ready_generation, items.receipt_id
    FROM settled_batch_items AS items
    JOIN finished
      ON finished.job_id = items.job_id
     AND finished.run_lease = items.run_lease
    WHERE NOT EXISTS (
    SELECT 1 FROM awa.lease_claim_closures AS closures
    WHERE closures.claim_slot = items.claim_slot
      AND closures.job_id = items.job_id
      AND closures.run_lease = items.run_lease
)
AND NOT EXISTS (
    SELECT 1 FROM awa.lease_claim_closure_batches AS closure_batches
    WHERE closure_batches.claim_slot = items.claim_slot
      AND closure_batches.receipt_ranges @> items.receipt_id
)
),
receipt_batch_closures AS (
    INSERT INTO awa.lease_claim_closure_batches (
        claim_slot, ready_slot, ready_generation, outcome, closed_count,
        receipt_ids, receipt_ranges, closed_at
    )
    SELECT
        claim_slot, ready_slot, ready_generation, 'rescue', count(*)::int,
        array_agg(receipt_id ORDER BY receipt_id),
        range_agg(int8range(receipt_id, receipt_id + 1, '[)') ORDER BY receipt_id),
        clock_timestamp()
    FROM open_batch_items
    GROUP BY claim_slot, ready_slot, ready_generation
    RETURNING claim_slot
),
deferred_rows AS (
    INSERT INTO awa.deferred_jobs (
        job_id, kind, queue, args, state, priority, attempt, run_lease, max_attempts,
        run_at, attempted_at, finalized_at, created_at, unique_key, unique_states, payload
    )
    SELECT
        job_id, kind, queue, args, 'retryable', priority, attempt, run_lease, max_attempts,
        next_run_at, attempted_at, settled_at, created_at, unique_key, unique_states, payload
    FROM finished
    WHERE outcome = 'retryable'
    RETURNING job_id
),
done_rows AS (
    INSERT INTO awa.done_entries (
        ready_slot, ready_generation, job_id, kind, queue, state, priority, attempt,
        run_lease, lane_seq, enqueue_shard, attempted_at, finalized_at, payload
    )
    SELECT
        ready_slot, ready_generation, job_id, kind, queue, outcome::awa.job_state, priority,
        attempt, run_lease, lane_seq, enqueue_shard, attempted_at, settled_at, payload
    FROM finished
    WHERE outcome IN ('failed', 'cancelled')
    RETURNING job_id
),
terminal_deltas AS (
    INSERT INTO awa.queue_terminal_count_deltas (
        ready_slot, ready_generation, queue, priority, enqueue_shard, counter_bucket,
        terminal_delta
    )
    SELECT ready_slot, ready_generation, queue, priority, enqueue_shard,
           (job_id % 256)::smallint, count(*)
    FROM finished
    WHERE outcome IN ('failed', 'cancelled')
    GROUP BY ready_slot, ready_generation, queue, priority, enqueue_shard,
             (job_id % 256)::smallint
    RETURNING terminal_delta
),
dlq_rows AS (
    INSERT INTO awa.dlq_entries (
        job_id, kind, queue, args, state, priority, attempt, run_lease, max_attempts,
        run_at, attempted_at, finalized_at, created_at, unique_key, unique_states, payload,
        dlq_reason, dlq_at, original_run_lease
    )
    SELECT
        job_id, kind, queue, args, 'failed', priority, attempt, run_lease, max_attempts,
        run_at, attempted_at, settled_at, created_at, unique_key, unique_states, payload,
        $18::text, settled_at, run_lease
    FROM finished
    WHERE outcome = 'dlq'
    RETURNING job_id
)
SELECT
    job_id AS id, kind, queue, args,
    (CASE outcome WHEN 'dlq' THEN 'failed' ELSE outcome END)::awa.job_state AS state,
    priority, attempt, max_attempts, next_run_at AS run_at,
    NULL::timestamptz AS heartbeat_at, NULL::timestamptz AS deadline_at, attempted_at,
    settled_at AS finalized_at, created_at,
    payload -> 'errors' AS errors,
    payload -> 'metadata' AS metadata,
    ARRAY(SELECT jsonb_array_elements_text(
        CASE WHEN jsonb_typeof(payload -> 'tags') = 'array' THEN payload -> 'tags'
             ELSE '[]'::jsonb END)) AS tags,
    unique_key, unique_states,
    NULL::uuid AS callback_id, NULL::timestamptz AS callback_timeout_at,
    NULL::text AS callback_filter, NULL::text AS callback_on_complete,
    NULL::text AS callback_on_fail, NULL::text AS callback_transform,
    run_lease, payload -> 'progress' AS progress,
    outcome
FROM finished
ORDER BY job_id;

-- awa_trio.engines.queue_storage.rotate_claim.CLAIM_CLEAN_SQL
-- identifiers: schema_literal='awa', slot=0
SELECT (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname IN ('lease_claims_' || (0), 'lease_claim_batches_' || (0), 'lease_claim_closures_' || (0), 'lease_claim_closure_batches_' || (0))) = 0
   AND EXISTS (
       SELECT 1 FROM awa.claim_ring_slots
       WHERE slot = 0
         AND rescue_cursor_claimed_at = '-infinity'
         AND rescue_cursor_job_id = 0
         AND rescue_cursor_run_lease = 0
         AND deadline_cursor_deadline_at = '-infinity'
         AND deadline_cursor_job_id = 0
         AND deadline_cursor_run_lease = 0
   );

-- awa_trio.engines.queue_storage.rotate_claim.CLAIM_OPEN_SQL
-- identifiers: lease_claim_batches=awa.lease_claim_batches_0, lease_claim_closure_batches=awa.lease_claim_closure_batches_0, lease_claim_closures=awa.lease_claim_closures_0, lease_claims=awa.lease_claims_0, slot=0
WITH totals AS (
    SELECT
        (SELECT count(*) FROM awa.lease_claims_0)
          + (SELECT COALESCE(sum(claimed_count), 0) FROM awa.lease_claim_batches_0) AS claimed,
        (SELECT count(*) FROM awa.lease_claim_closures_0)
          + (SELECT COALESCE(sum(closed_count), 0) FROM awa.lease_claim_closure_batches_0) AS closed
),
claims AS (
    SELECT job_id, run_lease, receipt_id
    FROM awa.lease_claims_0
    UNION ALL
    SELECT item.job_id, item.run_lease, item.receipt_id
    FROM awa.lease_claim_batches_0 AS batch,
         unnest(batch.job_ids, batch.run_leases, batch.receipt_ids)
             AS item(job_id, run_lease, receipt_id)
),
-- Receipts a compact closure names in its array and in its ranges both.
-- One hash of them beats a GiST probe per claim (10,000 claims: about
-- 30 ms against 130 ms, bench/bench_claim_prune.py).
closed_receipts AS (
    SELECT receipt.id
    FROM awa.lease_claim_closure_batches_0 AS closure_batch,
         unnest(closure_batch.receipt_ids) AS receipt(id)
    WHERE closure_batch.receipt_ranges @> receipt.id
),
unclosed AS (
    SELECT count(*) AS open_claims
    FROM claims
    WHERE (SELECT claimed <= closed FROM totals)
      AND NOT EXISTS (
          SELECT 1 FROM awa.lease_claim_closures_0 AS closure
          WHERE closure.claim_slot = 0
            AND closure.job_id = claims.job_id
            AND closure.run_lease = claims.run_lease
      )
      AND NOT EXISTS (
          SELECT 1 FROM closed_receipts WHERE closed_receipts.id = claims.receipt_id
      )
)
SELECT CASE WHEN claimed > closed THEN claimed - closed
            ELSE (SELECT open_claims FROM unclosed) END
FROM totals;

-- awa_trio.engines.queue_storage.rotate_claim.CLAIM_ROTATE_SQL
-- identifiers: schema_literal='awa'
WITH cursor AS (
    SELECT current_slot, generation, slot_count, (current_slot + 1) % slot_count AS next_slot
    FROM awa.claim_ring_state
    WHERE singleton
),
busy AS (
    SELECT
    (SELECT count(*) FROM (SELECT 1 FROM awa.lease_claims WHERE claim_slot = next.slot LIMIT 1000) AS capped)
      + (SELECT count(*) FROM (SELECT 1 FROM awa.lease_claim_batches WHERE claim_slot = next.slot LIMIT 1000) AS capped) AS "claim.rows",
    (SELECT count(*) FROM (SELECT 1 FROM awa.lease_claim_closures WHERE claim_slot = next.slot LIMIT 1000) AS capped) AS "claim.closure_rows",
    (SELECT count(*) FROM (SELECT 1 FROM awa.lease_claim_closure_batches WHERE claim_slot = next.slot LIMIT 1000) AS capped)
        AS "claim.closure_batch_rows"

    FROM (SELECT next_slot AS slot FROM cursor) AS next
),
locked AS (
    SELECT singleton FROM awa.claim_ring_state WHERE singleton FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE awa.claim_ring_state AS state
    SET current_slot = cursor.next_slot, generation = cursor.generation + 1
    FROM cursor, busy, locked
    WHERE state.singleton
      AND state.current_slot = cursor.current_slot
      AND state.generation = cursor.generation
      AND busy."claim.rows" = 0 AND busy."claim.closure_rows" = 0 AND busy."claim.closure_batch_rows" = 0
    RETURNING state.current_slot, state.generation, state.slot_count
),
stamped AS (
    UPDATE awa.claim_ring_slots AS slots
    SET generation = moved.generation
    FROM moved
    WHERE slots.slot = moved.current_slot
),
oldest AS (
    -- The oldest slot that has been current and is not now, once moved
    -- (oldest_sealed_slot, in SQL).
    SELECT ((moved.current_slot - (least(moved.generation + 1, moved.slot_count) - 1))
            % moved.slot_count + moved.slot_count) % moved.slot_count AS slot
    FROM moved
    WHERE least(moved.generation + 1, moved.slot_count) > 1
)
SELECT coalesce(moved.current_slot, cursor.current_slot) AS current_slot,
       coalesce(moved.generation, cursor.generation) AS generation,
       cursor.slot_count,
       moved.current_slot IS NOT NULL AS moved,
       (SELECT (SELECT (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname IN ('lease_claims_' || (oldest.slot), 'lease_claim_batches_' || (oldest.slot), 'lease_claim_closures_' || (oldest.slot), 'lease_claim_closure_batches_' || (oldest.slot))) = 0
   AND EXISTS (
       SELECT 1 FROM awa.claim_ring_slots
       WHERE slot = oldest.slot
         AND rescue_cursor_claimed_at = '-infinity'
         AND rescue_cursor_job_id = 0
         AND rescue_cursor_run_lease = 0
         AND deadline_cursor_deadline_at = '-infinity'
         AND deadline_cursor_job_id = 0
         AND deadline_cursor_run_lease = 0
   )) FROM oldest) AS oldest_clean,
       busy.*
FROM cursor CROSS JOIN busy LEFT JOIN moved ON true;

-- awa_trio.engines.queue_storage.rotate_claim.RESET_RESCUE_CURSORS_SQL
-- identifiers: slot=0
UPDATE awa.claim_ring_slots
SET rescue_cursor_claimed_at = '-infinity',
    rescue_cursor_job_id = 0,
    rescue_cursor_run_lease = 0,
    deadline_cursor_deadline_at = '-infinity',
    deadline_cursor_job_id = 0,
    deadline_cursor_run_lease = 0
WHERE slot = 0;

-- awa_trio.engines.queue_storage.rotate_lease.LEASE_CLEAN_SQL
-- identifiers: schema_literal='awa', slot=0
SELECT (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname IN ('leases_' || (0))) = 0;

-- awa_trio.engines.queue_storage.rotate_lease.LEASE_LIVE_SQL
-- identifiers: leases=awa.leases_0
SELECT (SELECT count(*) FROM (SELECT 1 FROM awa.leases_0 LIMIT 1000) AS capped);

-- awa_trio.engines.queue_storage.rotate_lease.LEASE_ROTATE_SQL
-- identifiers: schema_literal='awa'
WITH cursor AS (
    SELECT current_slot, generation, slot_count, (current_slot + 1) % slot_count AS next_slot
    FROM awa.lease_ring_state
    WHERE singleton
),
busy AS (
    SELECT
(SELECT count(*) FROM (SELECT 1 FROM awa.leases WHERE lease_slot = next.slot LIMIT 1000) AS capped) AS "lease.rows"

    FROM (SELECT next_slot AS slot FROM cursor) AS next
),
locked AS (
    SELECT singleton FROM awa.lease_ring_state WHERE singleton FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE awa.lease_ring_state AS state
    SET current_slot = cursor.next_slot, generation = cursor.generation + 1
    FROM cursor, busy, locked
    WHERE state.singleton
      AND state.current_slot = cursor.current_slot
      AND state.generation = cursor.generation
      AND busy."lease.rows" = 0
    RETURNING state.current_slot, state.generation, state.slot_count
),
stamped AS (
    UPDATE awa.lease_ring_slots AS slots
    SET generation = moved.generation
    FROM moved
    WHERE slots.slot = moved.current_slot
),
oldest AS (
    -- The oldest slot that has been current and is not now, once moved
    -- (oldest_sealed_slot, in SQL).
    SELECT ((moved.current_slot - (least(moved.generation + 1, moved.slot_count) - 1))
            % moved.slot_count + moved.slot_count) % moved.slot_count AS slot
    FROM moved
    WHERE least(moved.generation + 1, moved.slot_count) > 1
)
SELECT coalesce(moved.current_slot, cursor.current_slot) AS current_slot,
       coalesce(moved.generation, cursor.generation) AS generation,
       cursor.slot_count,
       moved.current_slot IS NOT NULL AS moved,
       (SELECT (SELECT (SELECT coalesce(sum(pg_relation_size(child.oid)), 0) FROM pg_class AS child WHERE child.relnamespace = 'awa'::regnamespace AND child.relname IN ('leases_' || (oldest.slot))) = 0) FROM oldest) AS oldest_clean,
       busy.*
FROM cursor CROSS JOIN busy LEFT JOIN moved ON true;

-- awa_trio.engines.queue_storage.terminal_count_rollup.ACTIVE_LEASES_SQL
-- parameters: $1 :slot, $2 :generation
SELECT EXISTS (
    SELECT 1 FROM awa.leases
    WHERE ready_slot = $1 AND ready_generation = $2
);

-- awa_trio.engines.queue_storage.terminal_count_rollup.CANDIDATE_SLOTS_SQL
-- parameters: $1 :current_slot
SELECT slots.slot, slots.generation
FROM awa.queue_ring_slots AS slots
WHERE slots.generation >= 0
  AND slots.slot <> $1
  AND EXISTS (
      SELECT 1
      FROM awa.queue_terminal_count_deltas AS deltas
      WHERE deltas.ready_slot = slots.slot
        AND deltas.ready_generation = slots.generation
  )
ORDER BY slots.generation, slots.slot;

-- awa_trio.engines.queue_storage.terminal_count_rollup.CURRENT_SLOT_SQL
SELECT current_slot FROM awa.queue_ring_state WHERE singleton;

-- awa_trio.engines.queue_storage.terminal_count_rollup.DELETE_GENERATION_DELTAS_SQL
-- identifiers: slot=0
-- parameters: $1 :generation
DELETE FROM awa.queue_terminal_count_deltas_0 WHERE ready_generation = $1;

-- awa_trio.engines.queue_storage.terminal_count_rollup.DELTA_ROWS_SQL
-- identifiers: slot=0
-- parameters: $1 :generation
SELECT
    count(*) FILTER (WHERE ready_generation = $1) AS this_generation,
    count(*) FILTER (WHERE ready_generation <> $1) AS other_generations
FROM awa.queue_terminal_count_deltas_0;

-- awa_trio.engines.queue_storage.terminal_count_rollup.FOLD_DELTAS_SQL
-- identifiers: slot=0
-- parameters: $1 :generation
WITH grouped AS MATERIALIZED (
    SELECT ready_slot, queue, priority, enqueue_shard, counter_bucket,
           sum(terminal_delta)::bigint AS delta
    FROM awa.queue_terminal_count_deltas_0
    WHERE ready_generation = $1
    GROUP BY ready_slot, queue, priority, enqueue_shard, counter_bucket
    HAVING sum(terminal_delta) <> 0
),
folded AS (
    INSERT INTO awa.queue_terminal_live_counts AS counts (
        ready_slot, queue, priority, enqueue_shard, counter_bucket, live_terminal_count
    )
    SELECT grouped.ready_slot, grouped.queue, grouped.priority, grouped.enqueue_shard,
           grouped.counter_bucket, grouped.delta
    FROM grouped
    WHERE grouped.delta > 0
       OR EXISTS (
           SELECT 1 FROM awa.queue_terminal_live_counts AS live
           WHERE live.ready_slot = grouped.ready_slot
             AND live.queue = grouped.queue
             AND live.priority = grouped.priority
             AND live.enqueue_shard = grouped.enqueue_shard
             AND live.counter_bucket = grouped.counter_bucket
       )
    ORDER BY grouped.ready_slot, grouped.queue, grouped.priority, grouped.enqueue_shard,
             grouped.counter_bucket
    ON CONFLICT (ready_slot, queue, priority, enqueue_shard, counter_bucket) DO UPDATE
    SET live_terminal_count =
        GREATEST(0, counts.live_terminal_count + EXCLUDED.live_terminal_count)
    RETURNING 1
)
SELECT (SELECT count(*) FROM grouped) AS grouped_keys, (SELECT count(*) FROM folded) AS folded;

-- awa_trio.engines.queue_storage.terminal_count_rollup.LOCK_DELTAS_SQL
-- identifiers: slot=0
LOCK TABLE awa.queue_terminal_count_deltas_0 IN ACCESS EXCLUSIVE MODE;

-- awa_trio.engines.queue_storage.terminal_count_rollup.LOCK_RING_SQL
SELECT current_slot FROM awa.queue_ring_state WHERE singleton FOR UPDATE;

-- awa_trio.engines.queue_storage.terminal_count_rollup.LOCK_SLOT_SQL
-- parameters: $1 :slot
SELECT generation FROM awa.queue_ring_slots WHERE slot = $1 FOR UPDATE;

-- awa_trio.engines.queue_storage.terminal_count_rollup.MVCC_PINNED_SQL
SELECT EXISTS (
    SELECT 1
    FROM pg_stat_activity
    WHERE datname = current_database()
      AND pid <> pg_backend_pid()
      AND backend_type = 'client backend'
      AND (backend_xmin IS NOT NULL
           OR (backend_xid IS NOT NULL AND state LIKE 'idle in transaction%'))
);

-- awa_trio.engines.queue_storage.terminal_count_rollup.PENDING_READY_SQL
-- identifiers: slot=0
-- parameters: $1 :generation
WITH cursors AS MATERIALIZED (
    SELECT queue, priority, enqueue_shard,
           awa.sequence_next_value(seq_name) AS claim_seq
    FROM awa.queue_claim_heads
)
SELECT EXISTS (
    SELECT 1
    FROM cursors
    WHERE EXISTS (
        SELECT 1
        FROM awa.ready_entries_0 AS ready
        WHERE ready.ready_generation = $1
          AND ready.queue = cursors.queue
          AND ready.priority = cursors.priority
          AND ready.enqueue_shard = cursors.enqueue_shard
          AND ready.lane_seq >= cursors.claim_seq
    )
);

-- awa_trio.engines.queue_storage.terminal_count_rollup.TRUNCATE_DELTAS_SQL
-- identifiers: slot=0
TRUNCATE TABLE awa.queue_terminal_count_deltas_0;

-- awa_trio.engines.queue_storage.terminal_count_rollup.UNCLOSED_CLAIMS_SQL
-- parameters: $1 :slot, $2 :generation
SELECT (
    (SELECT count(*) FROM awa.lease_claims
     WHERE ready_slot = $1 AND ready_generation = $2)
  + (SELECT COALESCE(sum(claimed_count), 0) FROM awa.lease_claim_batches
     WHERE ready_slot = $1 AND ready_generation = $2)
) <> (
    (SELECT count(*)
     FROM awa.lease_claims AS claims
     JOIN awa.lease_claim_closures AS closures
       ON closures.claim_slot = claims.claim_slot
      AND closures.job_id = claims.job_id
      AND closures.run_lease = claims.run_lease
     WHERE claims.ready_slot = $1 AND claims.ready_generation = $2)
  + (SELECT COALESCE(sum(closed_count), 0) FROM awa.lease_claim_closure_batches
     WHERE ready_slot = $1 AND ready_generation = $2)
);

-- awa_trio.grants.CURRENT_ROLE_SQL
SELECT current_user AS name, current_setting('is_superuser') = 'on' AS superuser;

-- awa_trio.grants.CURRENT_USER_SQL
SELECT current_user;

-- awa_trio.grants.DATABASE_SQL
SELECT oid, quote_ident(datname) AS sql_name FROM pg_database WHERE datname = current_database();

-- awa_trio.grants.FUNCTIONS_SQL
-- parameters: $1 :namespace, $2 :names
SELECT proname AS name, oid, oid::regprocedure::text AS sql_name
FROM pg_proc
WHERE pronamespace = $1 AND proname = ANY($2::text[])
ORDER BY proname, oid;

-- awa_trio.grants.MISSING_SQL
-- parameters: $1 :kinds, $2 :objects, $3 :privileges, $4 :labels
SELECT need.label
FROM unnest($1::text[], $2::oid[], $3::text[], $4::text[]) WITH ORDINALITY
    AS need(kind, object, privilege, label, position)
WHERE NOT COALESCE(
    CASE need.kind
        WHEN 'table' THEN has_table_privilege(need.object, need.privilege)
        WHEN 'sequence' THEN has_sequence_privilege(need.object, need.privilege)
        WHEN 'function' THEN has_function_privilege(need.object, need.privilege)
        WHEN 'schema' THEN has_schema_privilege(need.object, need.privilege)
        WHEN 'database' THEN has_database_privilege(need.object, need.privilege)
        WHEN 'role' THEN pg_has_role(need.object, need.privilege)
    END,
    true)
ORDER BY need.position;

-- awa_trio.grants.NAMED_BY_FUNCTIONS_SQL
-- parameters: $1 :names, $2 :namespace
SELECT name
FROM unnest($1::text[]) AS name
WHERE EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = $2 AND prosrc ~ ('\m' || name || '\M'));

-- awa_trio.grants.NAMESPACE_SQL
-- parameters: $1 :schema_name
SELECT oid, quote_ident(nspname) AS sql_name FROM pg_namespace WHERE nspname = $1;

-- awa_trio.grants.OWNERS_SQL
-- parameters: $1 :namespace, $2 :role_name
SELECT quote_ident(owner.rolname) AS sql_name, owner.rolsuper AS superuser
FROM pg_roles AS owner
WHERE owner.oid IN (
    SELECT nspowner FROM pg_namespace WHERE oid = $1
    UNION
    SELECT relowner FROM pg_class WHERE relnamespace = $1 AND relkind IN ('r', 'p', 'S')
)
  AND owner.rolname <> $2
ORDER BY owner.rolname;

-- awa_trio.grants.PARTITIONS_SQL
-- parameters: $1 :namespace, $2 :names
SELECT parent.relname AS parent, child.oid, child.oid::regclass::text AS sql_name
FROM pg_inherits AS inheritance
JOIN pg_class AS parent ON parent.oid = inheritance.inhparent
JOIN pg_class AS child ON child.oid = inheritance.inhrelid
WHERE parent.relnamespace = $1 AND parent.relname = ANY($2::text[])
ORDER BY parent.relname, length(child.relname), child.relname;

-- awa_trio.grants.QUOTE_DATABASE_SQL
SELECT quote_ident(current_database());

-- awa_trio.grants.QUOTE_ROLE_SQL
-- parameters: $1 :role_name
SELECT quote_ident($1);

-- awa_trio.grants.RELATIONS_SQL
-- parameters: $1 :namespace, $2 :names
SELECT relname AS name, oid, oid::regclass::text AS sql_name
FROM pg_class
WHERE relnamespace = $1 AND relname = ANY($2::text[]) AND relkind IN ('r', 'p', 'v');

-- awa_trio.grants.ROLE_SQL
-- parameters: $1 :role_name
SELECT oid, quote_ident(rolname) AS sql_name FROM pg_roles WHERE rolname = $1;

-- awa_trio.grants.SEQUENCES_SQL
-- parameters: $1 :namespace, $2 :names, $3 :prefixes
SELECT relname AS name, oid, oid::regclass::text AS sql_name
FROM pg_class
WHERE relnamespace = $1 AND relkind = 'S'
  AND (relname = ANY($2::text[])
       OR EXISTS (SELECT 1 FROM unnest($3::text[]) AS prefix WHERE starts_with(relname::text, prefix)))
ORDER BY relname;

-- awa_trio.leadership.HOLDER_SQL
-- parameters: $1 :pid
SELECT application_name, host(client_addr) AS client_addr
FROM pg_stat_activity
WHERE pid = $1;

-- awa_trio.leadership.HOLDS_LOCK_SQL
-- parameters: $1 :key
SELECT EXISTS (
    SELECT 1
    FROM pg_locks
    WHERE locktype = 'advisory'
      AND pid = pg_backend_pid()
      AND granted
      AND classid::bigint = ($1::bigint >> 32)
      AND objid::bigint = ($1::bigint & 4294967295)
      AND objsubid = 1
) AS held,
pg_is_in_recovery() AS in_recovery,
current_setting('transaction_read_only') = 'on' AS read_only;

-- awa_trio.leadership.TRY_LOCK_SQL
-- parameters: $1 :key
WITH attempt AS MATERIALIZED (
    SELECT pg_is_in_recovery() AS in_recovery,
           current_setting('transaction_read_only') = 'on' AS read_only,
           CASE WHEN (NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off') THEN pg_try_advisory_lock($1) ELSE false END AS acquired,
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
      AND l.classid::bigint = ($1::bigint >> 32)
      AND l.objid::bigint = ($1::bigint & 4294967295)
      AND l.objsubid = 1
    LIMIT 1
) AS holder ON true;

-- awa_trio.leadership.UNLOCK_SQL
-- parameters: $1 :key, $2 :channel
SELECT unlocked.released
FROM (SELECT pg_advisory_unlock($1) AS released) AS unlocked
LEFT JOIN LATERAL (
    SELECT pg_notify($2, '') WHERE unlocked.released
) AS notified ON true;

-- awa_trio.maintenance.batch_operations.FINALIZE_OPERATION_SQL
-- parameters: $1 :operation_id, $2 :state, $3 :retention_days, $4 :last_error
WITH target AS (
    SELECT id, state
    FROM awa.batch_operations
    WHERE id = $1 AND state IN ('scanning', 'running', 'cancelling')
    FOR UPDATE
), decided AS (
    SELECT id, CASE WHEN state = 'cancelling' THEN 'cancelled' ELSE $2::text END AS state
    FROM target
), skipped AS (
    UPDATE awa.batch_operation_items AS item
    SET state = 'skipped', processed_at = clock_timestamp()
    FROM decided
    WHERE item.operation_id = decided.id AND item.state = 'pending'
    RETURNING 1
)
UPDATE awa.batch_operations AS op
SET state = decided.state,
    skipped = op.skipped + (SELECT count(*) FROM skipped),
    finalized_at = COALESCE(op.finalized_at, clock_timestamp()),
    retention_until = COALESCE(
        op.retention_until, clock_timestamp() + $3::bigint * interval '1 day'
    ),
    last_error = COALESCE($4::text, op.last_error),
    updated_at = clock_timestamp()
FROM decided
WHERE op.id = decided.id
RETURNING op.state, (SELECT count(*) FROM skipped) AS skipped_now;

-- awa_trio.maintenance.batch_operations.HAS_PENDING_ITEMS_SQL
-- parameters: $1 :operation_id
SELECT EXISTS (
    SELECT 1 FROM awa.batch_operation_items
    WHERE operation_id = $1 AND state = 'pending'
);

-- awa_trio.maintenance.batch_operations.MARK_SCANNED_SQL
-- parameters: $1 :total_matched, $2 :cursor, $3 :operation_id
UPDATE awa.batch_operations
SET state = 'running',
    total_matched = $1,
    cursor = $2,
    updated_at = clock_timestamp()
WHERE id = $3 AND state = 'scanning'
RETURNING state;

-- awa_trio.maintenance.batch_operations.OPERATION_STATE_SQL
-- parameters: $1 :operation_id
SELECT state FROM awa.batch_operations WHERE id = $1;

-- awa_trio.maintenance.batch_operations.PENDING_ITEMS_SQL
-- parameters: $1 :operation_id, $2 :limit
SELECT job_id
FROM awa.batch_operation_items
WHERE operation_id = $1 AND state = 'pending'
ORDER BY job_id
LIMIT $2;

-- awa_trio.maintenance.batch_operations.RECORD_ITEM_ERROR_SQL
-- parameters: $1 :error, $2 :operation_id, $3 :job_id
WITH item AS (
    UPDATE awa.batch_operation_items
    SET state = 'errored', error = $1, processed_at = clock_timestamp()
    WHERE operation_id = $2 AND job_id = $3 AND state = 'pending'
    RETURNING 1
)
UPDATE awa.batch_operations
SET errored = errored + (SELECT count(*) FROM item),
    last_error = $1,
    updated_at = clock_timestamp()
WHERE id = $2
RETURNING state;

-- awa_trio.maintenance.batch_operations.RELEASE_RUNNER_LOCK_SQL
-- parameters: $1 :lock_key
SELECT pg_advisory_unlock($1);

-- awa_trio.maintenance.batch_operations.TRY_RUNNER_LOCK_SQL
-- parameters: $1 :lock_key
SELECT pg_try_advisory_lock($1);

-- awa_trio.maintenance.batch_operations.UNFINISHED_OPERATION_SQL
SELECT EXISTS (
    SELECT 1 FROM awa.batch_operations
    WHERE state IN ('pending', 'scanning', 'running', 'cancelling')
);

-- awa_trio.maintenance.cleanup.DELETE_EXPIRED_BATCH_OPERATIONS_SQL
-- parameters: $1 :limit
DELETE FROM awa.batch_operations
WHERE id IN (
    SELECT id
    FROM awa.batch_operations
    WHERE retention_until IS NOT NULL
      AND retention_until < clock_timestamp()
      AND state IN ('completed', 'cancelled', 'failed')
    ORDER BY retention_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
);

-- awa_trio.maintenance.cleanup.DELETE_STALE_JOB_KIND_DESCRIPTORS_SQL
-- parameters: $1 :retention
DELETE FROM awa.job_kind_descriptors
WHERE last_seen_at < now() - make_interval(secs => $1);

-- awa_trio.maintenance.cleanup.DELETE_STALE_QUEUE_DESCRIPTORS_SQL
-- parameters: $1 :retention
DELETE FROM awa.queue_descriptors
WHERE last_seen_at < now() - make_interval(secs => $1);

-- awa_trio.maintenance.cleanup.DELETE_STALE_RUNTIME_SNAPSHOTS_SQL
-- parameters: $1 :retention
DELETE FROM awa.runtime_instances
WHERE last_seen_at < now() - make_interval(secs => $1);

-- awa_trio.maintenance.lock_timeout.SET_LOCAL_LOCK_TIMEOUT_SQL
-- parameters: $1 :lock_timeout
SELECT set_config('lock_timeout', $1, true);

-- awa_trio.maintenance.rescue.CANCEL_NOTICES_SQL
-- parameters: $1 :job_ids, $2 :run_leases
SELECT count(pg_notify(
    'awa:cancel',
    jsonb_build_object('job_id', attempt.job_id, 'run_lease', attempt.run_lease)::text
))
FROM unnest($1::bigint[], $2::bigint[]) AS attempt(job_id, run_lease)
WHERE true;

-- awa_trio.maintenance.rescue.INSERT_FOLLOW_UP_SQL
-- parameters: $1 :kind, $2 :queue, $3 :args, $4 :state, $5 :priority, $6 :max_attempts, $7 :run_at, $8 :metadata, $9 :tags
SELECT id
FROM awa.insert_job_compat(
    p_kind => $1,
    p_queue => $2,
    p_args => $3::jsonb,
    p_state => $4::awa.job_state,
    p_priority => $5::smallint,
    p_max_attempts => $6::smallint,
    p_run_at => $7::timestamptz,
    p_metadata => $8::jsonb,
    p_tags => $9::text[]
);

-- awa_trio.runtime_instance.CANONICAL_JOBS_EXIST_SQL
SELECT EXISTS (SELECT 1 FROM awa.jobs_hot) OR EXISTS (SELECT 1 FROM awa.scheduled_jobs);

-- awa_trio.runtime_instance.DELETE_SQL
-- parameters: $1 :instance_id
DELETE FROM awa.runtime_instances WHERE instance_id = $1;

-- awa_trio.runtime_instance.MARK_SHUTTING_DOWN_SQL
-- parameters: $1 :instance_id
UPDATE awa.runtime_instances
SET shutting_down = true, leader = false, maintenance_alive = false, healthy = false,
    last_seen_at = now()
WHERE instance_id = $1;

-- awa_trio.runtime_instance.STORAGE_GATE_SQL
-- parameters: $1 :versions
SELECT (SELECT max(version) FROM awa.schema_version) = ANY($1::int[]) AS supported,
       sts.state,
       sts.prepared_engine IS NULL AS nothing_prepared
FROM awa.storage_transition_state AS sts
WHERE sts.singleton;

-- awa_trio.runtime_instance.UPSERT_SQL
-- parameters: $1 :instance_id, $2 :hostname, $3 :pid, $4 :version, $5 :storage_capability, $6 :transition_role, $7 :started_at, $8 :snapshot_interval_ms, $9 :healthy, $10 :maintenance_alive, $11 :shutting_down, $12 :leader
INSERT INTO awa.runtime_instances AS runtime (
    instance_id, hostname, pid, version, storage_capability, transition_role,
    started_at, last_seen_at, snapshot_interval_ms, healthy, postgres_connected,
    poll_loop_alive, heartbeat_alive, maintenance_alive, shutting_down, leader,
    global_max_workers, queues, queue_descriptor_hashes, job_kind_descriptor_hashes
)
VALUES (
    $1, $2, $3, $4, $5, $6,
    $7, now(), $8, $9, true,
    false, false, $10, $11, $12,
    NULL, '[]'::jsonb, '{}'::jsonb, '{}'::jsonb
)
ON CONFLICT (instance_id) DO UPDATE SET
    hostname = EXCLUDED.hostname,
    pid = EXCLUDED.pid,
    version = EXCLUDED.version,
    storage_capability = EXCLUDED.storage_capability,
    transition_role = EXCLUDED.transition_role,
    started_at = EXCLUDED.started_at,
    last_seen_at = now(),
    snapshot_interval_ms = EXCLUDED.snapshot_interval_ms,
    healthy = EXCLUDED.healthy,
    postgres_connected = EXCLUDED.postgres_connected,
    poll_loop_alive = EXCLUDED.poll_loop_alive,
    heartbeat_alive = EXCLUDED.heartbeat_alive,
    maintenance_alive = EXCLUDED.maintenance_alive,
    shutting_down = EXCLUDED.shutting_down,
    leader = EXCLUDED.leader,
    global_max_workers = EXCLUDED.global_max_workers,
    queues = EXCLUDED.queues,
    queue_descriptor_hashes = EXCLUDED.queue_descriptor_hashes,
    job_kind_descriptor_hashes = EXCLUDED.job_kind_descriptor_hashes;

-- awa_trio.schema._HAS_JOBS_SQL
SELECT EXISTS (SELECT 1 FROM awa.jobs);

-- awa_trio.schema._SCHEMA_AND_STORAGE_SQL
SELECT (SELECT max(version) FROM awa.schema_version) AS version,
       status.active_engine, status.state, status.details::text AS details
FROM (SELECT 1) AS always_one_row
LEFT JOIN awa.storage_status() AS status ON true;

-- awa_trio.schema._SCHEMA_PRESENT_SQL
SELECT to_regclass('awa.schema_version') IS NOT NULL;

-- awa_trio.schema._SCHEMA_VERSION_SQL
SELECT max(version) FROM awa.schema_version;

-- awa_trio.schema._SERVER_ANSWERS_SQL
SELECT 1;

-- awa_trio.schema._STORAGE_STATUS_SQL
SELECT active_engine, current_engine, prepared_engine, state, details::text AS details
FROM awa.storage_status();

-- awa_trio.service.DEFAULT_ISOLATION_SQL
SHOW default_transaction_isolation;

-- awa_trio.service.JIT_SQL
SHOW jit;

-- awa_trio.status.CRON_SQL
SELECT name, cron_expr, timezone, kind, queue, last_enqueued_at, paused_at
FROM awa.cron_jobs ORDER BY name;

-- awa_trio.status.LOCK_SESSIONS_SQL
-- parameters: $1 :lock_key
SELECT a.pid,
       a.application_name,
       host(a.client_addr) AS client_addr,
       a.backend_start,
       l.granted IS TRUE AS holds_lock
FROM pg_stat_activity AS a
LEFT JOIN pg_locks AS l
  ON l.pid = a.pid
 AND l.locktype = 'advisory'
 AND l.granted
 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
 AND (l.classid::bigint << 32 | l.objid::bigint) = $1
 AND l.objsubid = 1
WHERE a.datname = current_database()
  AND (l.pid IS NOT NULL OR a.application_name LIKE 'awa_trio % lock')
ORDER BY holds_lock DESC, a.backend_start;

-- awa_trio.status.RUNTIMES_SQL
SELECT instance_id, hostname, pid, version, leader, maintenance_alive, storage_capability,
       transition_role, shutting_down, last_seen_at,
       version LIKE '%+awa-trio.%' AS awa_trio
FROM awa.runtime_instances
WHERE last_seen_at + make_interval(secs => greatest(greatest(snapshot_interval_ms, 1000) * 3, 30000) / 1000.0)
      >= now()
ORDER BY leader DESC, awa_trio DESC, hostname, pid;
