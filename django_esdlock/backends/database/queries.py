"""The listing queries every dialect fills in with its own columns, joins and collation."""

from __future__ import annotations


def page_query(
    record_columns: str, node_order: str, holder_order: str, *, node_columns: str, holders_join: str, holders_of_n: str
) -> str:
    """Pages of nodes that have a holder matching {holders}, with those holders, in node then holder order.

    ``{nodes}`` and ``{holders}`` stay in the text, filled later with joined
    constant fragments. ``holders_join`` joins node ``n`` to its holders
    ``h`` (one row per node and holder); ``holders_of_n`` is the same as a
    FROM list and WHERE start for an EXISTS; the orders differ per database
    only in collation.
    """
    return f"""
WITH page AS (
    SELECT {node_columns} FROM esdlock_node n
    WHERE {{nodes}} AND EXISTS (SELECT 1 FROM {holders_of_n} {{holders}})
    ORDER BY {node_order}
    LIMIT %(limit)s
)
SELECT {record_columns} FROM page n {holders_join}
WHERE {{holders}}
ORDER BY {node_order}, {holder_order}
"""


def records_query(record_columns: str, node_order: str, holder_order: str, *, holders_join: str) -> str:
    """Every holder matching {nodes} and {holders} at once, in the order of :func:`page_query`."""
    return f"""
SELECT {record_columns} FROM esdlock_node n {holders_join}
WHERE {{nodes}} AND {{holders}}
ORDER BY {node_order}, {holder_order}
"""
