"""The statements of the three queue-storage rescues (their control flow
is :mod:`.rescue`), and why each is safe beside the writers it meets.

On queue storage a running attempt lives in one of three places:

* a ``leases`` row (an attempt that was materialised: it registered a
  callback, or ran on the legacy non-receipt path; progress alone stays in
  ``attempt_state``);
* a row of ``lease_claims`` (the receipt fast path for a job with a
  deadline: no ``leases`` row at all, the deadline is
  ``lease_claims.deadline_at``);
* an item of a compact ``lease_claim_batches`` row (the fast path for jobs
  without a deadline).

Workers heartbeat into ``attempt_state`` (falling back to the lease's own
``heartbeat_at``, then to the claim time), and an attempt ends when closure
evidence exists: a ``lease_claim_closures`` row, a
``lease_claim_closure_batches`` range holding its receipt, or a terminal,
deferred or DLQ row of the same ``(job_id, run_lease)``. Successful
completions go to ``receipt_completion_batches`` with a closure beside them.

A rescue batch is one transaction of a few statements:

1. **take**: delete up to N stale/expired ``leases`` rows (``SKIP LOCKED``),
   and/or take open receipt claims: first lock them (``SKIP LOCKED``, and
   ``pg_try_advisory_xact_lock`` on the worker's completion lock
   ``awa.receipt.complete:<job>:<run_lease>``, so a claim whose completion
   is in flight is skipped), then, in a new statement whose snapshot is
   taken after the locks, re-check that no closure appeared and write the
   rescue closure;
2. **settle** (:data:`SETTLE_SQL`, one statement for the whole batch): read
   each job from its ready entry, drop its ``attempt_state`` (keeping the
   progress), close any receipt evidence left open, move the unique claim,
   and write the successor row: ``retryable`` in ``deferred_jobs`` with
   ``run_at = now() + awa.backoff_duration(attempt, max_attempts)``, or,
   for an expired callback on its last attempt, a ``failed`` done row
   (with its terminal-count delta) or a ``dlq_entries`` row when the DLQ
   policy enables the queue.

Unique claims are application-side on queue storage (no triggers). A row
whose successor state claims its key but whose running state did not may
find a newer duplicate holding the claim: the settle statement tries the
claim (``ON CONFLICT ... WHERE`` the holder is this job) and turns every
row that did not get it into a ``cancelled`` done row, in the same
statement.

Concurrent writers, and what makes each pair safe:

* **The worker of the attempt** (completing, failing, heartbeating,
  registering a callback): a lease is taken by deleting its row ``SKIP
  LOCKED``, so a worker that is writing it keeps it, and one that committed
  first leaves nothing to delete. A receipt claim is taken only with the
  worker's completion advisory lock (``pg_try_advisory_xact_lock``, skipped
  when held), and the closure check runs again in a new statement after the
  locks, so a completion that committed meanwhile is seen and the claim is
  left alone.
* **Another rescuer** (a foreign leader, our other rescue branches): the
  same ``SKIP LOCKED`` row locks and try-locks, so each attempt is settled
  once.
* **Prune and rollup of the attempt's queue slot**: an open lease or claim
  is a gate of both, and stays visible until the settle statement commits
  its successor rows (done row, count delta, closure) under the attempt's
  own ``(ready_slot, ready_generation)``, which the gates read after their
  locks. The settle statement reads every ``ready_entries`` partition, so it
  holds their share locks before a prune's ACCESS EXCLUSIVE can be granted.
* **Unique claims** are moved with ``ON CONFLICT ... WHERE`` the holder is
  this job; a newer duplicate keeps its claim and this job ends cancelled.
* **DLQ rows** (an expired callback on its last attempt) are inserted by the
  settle statement itself; the DLQ purge only deletes rows past retention.
"""

from __future__ import annotations

from ...maintenance.rescue import CANCEL_NOTICES
from ...sql import Fragment, Statement
from .layout import TERMINAL_COUNTER_BUCKETS, mask_claims

#: Closure outcomes written to the receipt ledgers.
OUTCOME_STALE_RECEIPT = "rescued"
OUTCOME_DEADLINE_RECEIPT = "deadline_expired"
#: (Written as the literal 'rescue' in SETTLE_SQL.)
OUTCOME_SETTLED = "rescue"

# No closure in the receipt ledgers for one receipt: no explicit closure, no
# closure batch holding it. The settle statement closes what this finds
# still open; STILL_OPEN adds the successor rows. {claim_slot}, {job_id},
# {run_lease}, {receipt_id} name columns (of one alias, or of two: a compact
# item takes its claim slot from its batch).
_NOT_CLOSED_IN_LEDGERS = """NOT EXISTS (
        SELECT 1 FROM {schema}.lease_claim_closures AS closures
        WHERE closures.claim_slot = {claim_slot}
          AND closures.job_id = {job_id}
          AND closures.run_lease = {run_lease}
    )
    AND NOT EXISTS (
        SELECT 1 FROM {schema}.lease_claim_closure_batches AS closure_batches
        WHERE closure_batches.claim_slot = {claim_slot}
          AND closure_batches.receipt_ranges @> {receipt_id}
    )"""
NOT_CLOSED_IN_LEDGERS = Fragment(_NOT_CLOSED_IN_LEDGERS)

# No closure evidence for one attempt, as Awa's readers and prune gates
# judge it: not closed in the ledgers, and no terminal, deferred or DLQ row
# of the same (job_id, run_lease). Written as a conjunction of NOT EXISTS
# (not NOT (a OR b ...)) so that the planner can turn each into an anti-join
# over a whole batch of candidates instead of probing every table once per
# candidate. Slots as NOT_CLOSED_IN_LEDGERS.
STILL_OPEN = Fragment(
    """(
    """
    + _NOT_CLOSED_IN_LEDGERS
    + """
    AND NOT EXISTS (
        SELECT 1 FROM {schema}.done_entries AS done
        WHERE done.job_id = {job_id} AND done.run_lease = {run_lease}
    )
    AND NOT EXISTS (
        SELECT 1 FROM {schema}.deferred_jobs AS deferred
        WHERE deferred.job_id = {job_id} AND deferred.run_lease = {run_lease}
    )
    AND NOT EXISTS (
        SELECT 1 FROM {schema}.dlq_entries AS dlq
        WHERE dlq.job_id = {job_id} AND dlq.run_lease = {run_lease}
    )
)"""
)


#: The worker's completion lock of one receipt attempt: awa-pg's workers take this key.
COMPLETION_LOCK_KEY = Fragment(
    "pg_catalog.hashtextextended(format('awa.receipt.complete:%s:%s', {job_id}, {run_lease}), 0)"
)


#: Columns every take statement returns (one taken attempt); SETTLE_SQL takes
#: each, over the whole batch, as the array parameter of the same name.
TAKEN_COLUMNS = (
    "ready_slot", "ready_generation", "job_id", "queue", "state", "priority", "attempt",
    "run_lease", "max_attempts", "lane_seq", "enqueue_shard", "attempted_at", "rescue_error",
)  # fmt: skip

# Take: delete locked `leases` rows matching {predicate}, oldest {order_by}
# first. Parameters: the predicate's own, :limit (rows), :job_ids (NULL: any
# job) and :error (the error entry of each taken attempt).
TAKE_LEASES_TEMPLATE = Fragment("""
    WITH picked AS (
        SELECT lease.lease_slot, lease.queue, lease.priority, lease.enqueue_shard, lease.lane_seq
        FROM {schema}.leases AS lease
        LEFT JOIN {schema}.attempt_state AS attempt
          ON attempt.job_id = lease.job_id
         AND attempt.run_lease = lease.run_lease
        WHERE {predicate}
          AND (:job_ids::bigint[] IS NULL OR lease.job_id = ANY(:job_ids::bigint[]))
        ORDER BY {order_by}, lease.job_id
        LIMIT :limit
        FOR UPDATE OF lease SKIP LOCKED
    )
    DELETE FROM {schema}.leases AS lease
    USING picked
    WHERE lease.lease_slot = picked.lease_slot
      AND lease.queue = picked.queue
      AND lease.priority = picked.priority
      AND lease.enqueue_shard = picked.enqueue_shard
      AND lease.lane_seq = picked.lane_seq
    RETURNING
        lease.ready_slot, lease.ready_generation, lease.job_id, lease.queue, lease.state,
        lease.priority, lease.attempt, lease.run_lease, lease.max_attempts, lease.lane_seq,
        lease.enqueue_shard, lease.attempted_at, :error::text AS rescue_error
""")


# Take, receipt side, step 2 of 2: the attempts locked by step 1
# (:claim_slots, :job_ids, :run_leases), re-checked under a snapshot taken
# after the locks; each still open gets its closure (:outcome): row claims
# in lease_claim_closures (plus closed_at), compact claims one closure batch
# per (claim slot, ready slot, generation). :error = error text.
CLOSE_RECEIPTS_SQL = Statement(
    """
    WITH locked(claim_slot, job_id, run_lease) AS (
        SELECT * FROM unnest(:claim_slots::int[], :job_ids::bigint[], :run_leases::bigint[])
    ),
    row_claims AS MATERIALIZED (
        SELECT
            claims.claim_slot, claims.ready_slot, claims.ready_generation, claims.job_id,
            claims.queue, claims.priority, claims.attempt, claims.run_lease,
            claims.max_attempts, claims.lane_seq, claims.enqueue_shard, claims.claimed_at
        FROM locked
        JOIN {schema}.lease_claims AS claims
          ON claims.claim_slot = locked.claim_slot
         AND claims.job_id = locked.job_id
         AND claims.run_lease = locked.run_lease
        WHERE claims.closed_at IS NULL
          AND {claims_open}
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.leases AS lease
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
        FROM {schema}.lease_claim_batches AS claim_batches
        CROSS JOIN LATERAL unnest(
            claim_batches.job_ids, claim_batches.run_leases, claim_batches.receipt_ids,
            claim_batches.lane_seqs, claim_batches.attempts, claim_batches.max_attempts
        ) AS items(job_id, run_lease, receipt_id, lane_seq, attempt, max_attempts)
        WHERE claim_batches.claim_slot = ANY(:claim_slots::int[])
          AND claim_batches.job_ids && :job_ids::bigint[]
    ),
    batch_claims AS MATERIALIZED (
        SELECT batch_items.*
        FROM batch_items
        JOIN locked
          ON locked.claim_slot = batch_items.claim_slot
         AND locked.job_id = batch_items.job_id
         AND locked.run_lease = batch_items.run_lease
        WHERE {batch_items_open}
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.leases AS lease
              WHERE lease.job_id = batch_items.job_id
                AND lease.run_lease = batch_items.run_lease
          )
    ),
    row_closed AS (
        INSERT INTO {schema}.lease_claim_closures
            (claim_slot, job_id, run_lease, outcome, closed_at)
        SELECT claim_slot, job_id, run_lease, :outcome::text, clock_timestamp()
        FROM row_claims
        ON CONFLICT (claim_slot, job_id, run_lease) DO NOTHING
        RETURNING claim_slot, job_id, run_lease, closed_at
    ),
    row_marked AS (
        UPDATE {schema}.lease_claims AS claims
        SET closed_at = COALESCE(claims.closed_at, row_closed.closed_at)
        FROM row_closed
        WHERE claims.claim_slot = row_closed.claim_slot
          AND claims.job_id = row_closed.job_id
          AND claims.run_lease = row_closed.run_lease
        RETURNING claims.job_id
    ),
    batch_closed AS (
        INSERT INTO {schema}.lease_claim_closure_batches (
            claim_slot, ready_slot, ready_generation, outcome, closed_count,
            receipt_ids, receipt_ranges, closed_at
        )
        SELECT
            claim_slot, ready_slot, ready_generation, :outcome::text, count(*)::int,
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
        :error::text AS rescue_error
    FROM row_claims
    JOIN row_closed
      ON row_closed.claim_slot = row_claims.claim_slot
     AND row_closed.job_id = row_claims.job_id
     AND row_closed.run_lease = row_claims.run_lease
    UNION ALL
    SELECT
        ready_slot, ready_generation, job_id, queue, 'running'::awa.job_state, priority, attempt,
        run_lease, max_attempts, lane_seq, enqueue_shard, claimed_at, :error::text
    FROM batch_claims
    WHERE EXISTS (SELECT 1 FROM batch_closed)
""",
    claims_open=STILL_OPEN(
        claim_slot="claims.claim_slot",
        job_id="claims.job_id",
        run_lease="claims.run_lease",
        receipt_id="claims.receipt_id",
    ),
    batch_items_open=STILL_OPEN(
        claim_slot="batch_items.claim_slot",
        job_id="batch_items.job_id",
        run_lease="batch_items.run_lease",
        receipt_id="batch_items.receipt_id",
    ),
)


# Settle the taken attempts of one batch. Column effects: see the module
# docstring. Parameters: each of TAKEN_COLUMNS by its name, as the array of
# that column over the taken attempts (so :job_id is every taken job id);
# :exhausts_to_failed, :dlq_queues (queues whose exhausted attempts go to
# the DLQ), :cancel (every attempt becomes a cancelled duplicate),
# :duplicate_error and :dlq_reason. Returns each rescued job as an
# awa.jobs-shaped row plus `outcome` (retryable, failed, dlq, cancelled).
SETTLE_SQL = Statement(
    """
    WITH taken AS MATERIALIZED (
        SELECT *
        FROM unnest(
            :ready_slot::int[], :ready_generation::bigint[], :job_id::bigint[], :queue::text[], :state::awa.job_state[],
            :priority::smallint[], :attempt::smallint[], :run_lease::bigint[], :max_attempts::smallint[], :lane_seq::bigint[],
            :enqueue_shard::smallint[], :attempted_at::timestamptz[], :rescue_error::text[]
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
        JOIN {schema}.ready_entries AS ready
          ON ready.ready_slot = taken.ready_slot
         AND ready.ready_generation = taken.ready_generation
         AND ready.queue = taken.queue
         AND ready.enqueue_shard = taken.enqueue_shard
         AND ready.lane_seq = taken.lane_seq
         AND ready.job_id = taken.job_id
    ),
    attempt_rows AS (
        DELETE FROM {schema}.attempt_state AS attempt
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
                WHEN :cancel::boolean THEN 'cancelled'
                WHEN :exhausts_to_failed::boolean AND hydrated.attempt >= hydrated.max_attempts THEN
                    CASE WHEN hydrated.queue = ANY(:dlq_queues::text[]) THEN 'dlq' ELSE 'failed' END
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
                AND {old_claims} AS old_claims,
            planned.unique_key IS NOT NULL AND planned.target <> 'cancelled'
                AND {new_claims} AS new_claims
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
          AND NOT {still_claims}
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
                            'error', :duplicate_error::text,
                            'attempt', settled.attempt,
                            'at', clock_timestamp(),
                            'terminal', true
                        ))
                        ELSE '[]'::jsonb END
            ) AS payload
        FROM settled
    ),
    receipt_row_closures AS (
        INSERT INTO {schema}.lease_claim_closures
            (claim_slot, job_id, run_lease, outcome, closed_at)
        SELECT claims.claim_slot, claims.job_id, claims.run_lease, 'rescue',
               clock_timestamp()
        FROM {schema}.lease_claims AS claims
        JOIN finished
          ON finished.job_id = claims.job_id
         AND finished.run_lease = claims.run_lease
        ON CONFLICT (claim_slot, job_id, run_lease) DO NOTHING
        RETURNING claim_slot, job_id, run_lease, closed_at
    ),
    receipt_rows_marked AS (
        UPDATE {schema}.lease_claims AS claims
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
        FROM {schema}.lease_claim_batches AS claim_batches
        CROSS JOIN LATERAL unnest(
            claim_batches.job_ids, claim_batches.run_leases, claim_batches.receipt_ids
        ) AS items(job_id, run_lease, receipt_id)
        WHERE claim_batches.job_ids && :job_id::bigint[]
    ),
    open_batch_items AS (
        SELECT items.claim_slot, items.ready_slot, items.ready_generation, items.receipt_id
        FROM settled_batch_items AS items
        JOIN finished
          ON finished.job_id = items.job_id
         AND finished.run_lease = items.run_lease
        WHERE {open_batch_items_not_closed}
    ),
    receipt_batch_closures AS (
        INSERT INTO {schema}.lease_claim_closure_batches (
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
        INSERT INTO {schema}.deferred_jobs (
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
        INSERT INTO {schema}.done_entries (
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
        INSERT INTO {schema}.queue_terminal_count_deltas (
            ready_slot, ready_generation, queue, priority, enqueue_shard, counter_bucket,
            terminal_delta
        )
        SELECT ready_slot, ready_generation, queue, priority, enqueue_shard,
               (job_id % {counter_buckets})::smallint, count(*)
        FROM finished
        WHERE outcome IN ('failed', 'cancelled')
        GROUP BY ready_slot, ready_generation, queue, priority, enqueue_shard,
                 (job_id % {counter_buckets})::smallint
        RETURNING terminal_delta
    ),
    dlq_rows AS (
        INSERT INTO {schema}.dlq_entries (
            job_id, kind, queue, args, state, priority, attempt, run_lease, max_attempts,
            run_at, attempted_at, finalized_at, created_at, unique_key, unique_states, payload,
            dlq_reason, dlq_at, original_run_lease
        )
        SELECT
            job_id, kind, queue, args, 'failed', priority, attempt, run_lease, max_attempts,
            run_at, attempted_at, settled_at, created_at, unique_key, unique_states, payload,
            :dlq_reason::text, settled_at, run_lease
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
    ORDER BY job_id
""",
    old_claims=mask_claims("planned.unique_states", "planned.old_state"),
    new_claims=mask_claims(
        "planned.unique_states", "CASE planned.target WHEN 'dlq' THEN 'failed' ELSE planned.target END"
    ),
    still_claims=mask_claims(
        "settled.unique_states", "CASE settled.outcome WHEN 'dlq' THEN 'failed' ELSE settled.outcome END"
    ),
    counter_buckets=str(TERMINAL_COUNTER_BUCKETS),
    open_batch_items_not_closed=NOT_CLOSED_IN_LEDGERS(
        claim_slot="items.claim_slot",
        job_id="items.job_id",
        run_lease="items.run_lease",
        receipt_id="items.receipt_id",
    ),
)


#: Cancel notices of queue-storage attempts, except one whose (id, lease) a
#: running canonical row also has: during a transition the two id sequences
#: overlap, and the listener matches (job_id, run_lease) alone; a wrong
#: cancel would lose that attempt's work (canonical_drain does the same the
#: other way round).
QUEUE_STORAGE_NOTICES_SQL = Statement(
    CANCEL_NOTICES(
        unless="""NOT EXISTS (
            SELECT 1 FROM awa.jobs_hot AS hot
            WHERE hot.id = attempt.job_id
              AND hot.run_lease = attempt.run_lease
              AND hot.state = 'running'
        )"""
    )
)

#: Transaction-local: no JIT for the rescue statements.
NO_JIT_SQL = Statement("SET LOCAL jit = off")
