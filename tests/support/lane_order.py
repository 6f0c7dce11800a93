"""The lane-order invariant of queue storage, as SQL a test can check.

Within a lane (queue, priority, enqueue shard) a higher lane position is
never filed under an older ring generation. The claimer relies on it: it
reads one ring slot at a time and moves the lane's claim cursor past the
highest position it took there, so a position filed under an older slot than
a lower one makes the cursor jump over the lower one, and that job is never
claimed (and a later prune truncates it).
"""

from __future__ import annotations

#: Ready entries and ready segments that break the order, one row each.
LANE_ORDER_VIOLATIONS_SQL = """
    WITH entries AS (
        SELECT 'entry' AS what, queue, priority, enqueue_shard, lane_seq AS position,
               ready_generation,
               max(ready_generation) OVER (
                   PARTITION BY queue, priority, enqueue_shard ORDER BY lane_seq
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
               ) AS newest_before
        FROM {schema}.ready_entries
    ),
    segments AS (
        SELECT 'segment' AS what, queue, priority, enqueue_shard, first_lane_seq AS position,
               ready_generation,
               max(ready_generation) OVER (
                   PARTITION BY queue, priority, enqueue_shard ORDER BY first_lane_seq
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
               ) AS newest_before
        FROM {schema}.ready_segments
    )
    SELECT what, queue, priority, enqueue_shard, position, ready_generation, newest_before
    FROM (SELECT * FROM entries UNION ALL SELECT * FROM segments) AS filed
    WHERE ready_generation < newest_before
    ORDER BY what, queue, priority, enqueue_shard, position
"""


async def lane_order_violations(db, schema: str = "awa") -> list:
    return list(await db.fetch(LANE_ORDER_VIOLATIONS_SQL.format(schema=schema)))
