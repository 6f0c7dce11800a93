"""``awa.queue.info``: one series per declared queue (value 1) carrying its
descriptor as labels, the join target Awa's Grafana dashboard uses to show
display names and owners. Published by queue_stats on either engine."""

from __future__ import annotations

from .context import MaintenanceContext

QUEUE_DESCRIPTORS_SQL = """
    SELECT queue, display_name, description, owner, docs_url, tags
    FROM awa.queue_descriptors
    ORDER BY queue
"""


async def publish_queue_info(ctx: MaintenanceContext) -> int:
    """Returns how many queues were published."""
    rows = await ctx.db.fetch(QUEUE_DESCRIPTORS_SQL)
    for row in rows:
        ctx.metrics.record_queue_info(
            row["queue"],
            row["display_name"],
            row["description"],
            row["owner"],
            row["docs_url"],
            list(row["tags"] or ()),
        )
    return len(rows)
