-- esdlock_release v3 (migration 0004): v2, and a release of a grant without intent commits without waiting
-- for the WAL flush (lost in a crash, it only leaves the grant to its lease; a released intent must not come
-- back, so that one waits for the flush); each waiter it may free is sent its holder id as the payload, so a
-- session that listens for many requests (the async client's) wakes only that one. Current.
CREATE OR REPLACE FUNCTION esdlock_release(p_holder_id text, p_owner_key text, p_conflicts jsonb)
RETURNS boolean LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_nodes jsonb;
    v_intent jsonb;
    v_channel text;
    v_waiter text;
BEGIN
    DELETE FROM esdlock_grant
    WHERE holder_id = p_holder_id AND (p_owner_key IS NULL OR owner_key = p_owner_key)
    RETURNING nodes, intent INTO v_nodes, v_intent;
    IF v_nodes IS NULL THEN
        RETURN false;
    END IF;
    IF v_intent IS NULL THEN
        -- Lost in a crash, this release leaves the grant to its lease; a
        -- released intent must not come back: that one waits for the flush.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    FOR v_channel, v_waiter IN
        WITH waking AS (
            SELECT w.node_id, w.mode, w.channel, w.holder_id,
                   rank() OVER (PARTITION BY w.node_id ORDER BY w.ticket) AS place
            FROM jsonb_each_text(v_nodes) AS r(node_id, mode)
            JOIN esdlock_waiter w ON w.node_id = r.node_id
            WHERE w.expires_at > statement_timestamp() AND w.channel <> ''
              AND (p_conflicts -> r.mode) ? w.mode
        )
        SELECT DISTINCT k.channel, k.holder_id FROM waking k JOIN waking head ON head.node_id = k.node_id AND head.place = 1
        WHERE k.place = 1 OR (k.mode = head.mode AND NOT ((p_conflicts -> head.mode) ? head.mode))
    LOOP
        PERFORM pg_notify(v_channel, v_waiter);
    END LOOP;
    RETURN true;
END
$$
