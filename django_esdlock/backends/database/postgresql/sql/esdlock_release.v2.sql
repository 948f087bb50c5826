-- esdlock_release v2 (migration 0003): delete one grant of its owner (anyone's with a null owner key: a forced
-- release); its node rows are not touched (their entries of it are dropped by the next acquisition of each).
-- Then, only if someone waits on its nodes, notify at commit the channels of the waiters it may free: per
-- node, the earliest live marker in a mode the release gave back a conflict with, and the markers of the same
-- mode behind it when that mode is compatible with itself (p_conflicts: mode -> modes that conflict with it,
-- from modes.py). Returns whether the grant was there. Replaced by v3 (0004).
CREATE OR REPLACE FUNCTION esdlock_release(p_holder_id text, p_owner_key text, p_conflicts jsonb)
RETURNS boolean LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_nodes jsonb;
    v_channel text;
BEGIN
    DELETE FROM esdlock_grant
    WHERE holder_id = p_holder_id AND (p_owner_key IS NULL OR owner_key = p_owner_key)
    RETURNING nodes INTO v_nodes;
    IF v_nodes IS NULL THEN
        RETURN false;
    END IF;
    FOR v_channel IN
        WITH waking AS (
            SELECT w.node_id, w.mode, w.channel,
                   rank() OVER (PARTITION BY w.node_id ORDER BY w.ticket) AS place
            FROM jsonb_each_text(v_nodes) AS r(node_id, mode)
            JOIN esdlock_waiter w ON w.node_id = r.node_id
            WHERE w.expires_at > statement_timestamp() AND w.channel <> ''
              AND (p_conflicts -> r.mode) ? w.mode
        )
        SELECT DISTINCT k.channel FROM waking k JOIN waking head ON head.node_id = k.node_id AND head.place = 1
        WHERE k.place = 1 OR (k.mode = head.mode AND NOT ((p_conflicts -> head.mode) ? head.mode))
    LOOP
        PERFORM pg_notify(v_channel, '');
    END LOOP;
    RETURN true;
END
$$
