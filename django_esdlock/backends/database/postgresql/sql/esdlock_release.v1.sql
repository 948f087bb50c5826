-- esdlock_release v1 (migration 0002): remove one holder of its owner (anyone's with a null owner key: a
-- forced release) and expired holders without an intent from these nodes, delete the nodes left with no
-- holder, and announce the release to waiters (delivered at commit). Returns how many of the holder's rows
-- were removed. Dropped by 0003 (v2 has another signature).
CREATE OR REPLACE FUNCTION esdlock_release(
    p_ids text[], p_holder_id text, p_owner_key text, p_payload text
) RETURNS bigint LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now timestamptz := statement_timestamp();
    v_released bigint;
BEGIN
    -- Release deletes node rows, hence FOR UPDATE (not NO KEY), in one order.
    PERFORM 1 FROM esdlock_node WHERE id = ANY(p_ids) ORDER BY id COLLATE "C" FOR UPDATE;
    WITH gone AS (
        DELETE FROM esdlock_holder
        WHERE node_id = ANY(p_ids)
          AND ((holder_id = p_holder_id AND (p_owner_key IS NULL OR owner_key = p_owner_key))
               OR (intent IS NULL AND expires_at <= v_now))
        RETURNING holder_id = p_holder_id AND (p_owner_key IS NULL OR owner_key = p_owner_key) AS released
    )
    SELECT count(*) FILTER (WHERE released) INTO v_released FROM gone;
    DELETE FROM esdlock_node n
    WHERE n.id = ANY(p_ids) AND NOT EXISTS (SELECT 1 FROM esdlock_holder h WHERE h.node_id = n.id);
    PERFORM pg_notify('esdlock', p_payload);
    RETURN v_released;
END
$$
