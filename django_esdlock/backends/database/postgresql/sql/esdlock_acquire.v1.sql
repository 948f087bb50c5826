-- esdlock_acquire v1 (migration 0002): take every (node, mode) of a request for one holder, all or nothing,
-- in one server-side call, so a lock pair costs three round trips whatever the depth. Layout of 0001: one
-- esdlock_holder row per node and holder. Every statement runs with a fresh snapshot (READ COMMITTED), after
-- the node row locks the first statement takes in one global order (bytewise id order). The mode matrix is
-- not here: the client passes, per node, the modes that conflict with the one it asks for (django_esdlock.modes
-- is its only copy). Replaced by v2 (0003).
CREATE OR REPLACE FUNCTION esdlock_acquire(
    p_ids text[], p_namespaces text[], p_kinds text[], p_keys text[], p_parents text[], p_depths int[],
    p_modes text[], p_conflicts text[], p_holder_id text, p_owner jsonb, p_owner_key text, p_ttl_ms float8,
    p_intent jsonb, p_reentrant boolean, p_ticket bigint, p_marker_ttl_ms float8,
    OUT token bigint, OUT taken text[], OUT wrote boolean
) LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now timestamptz := statement_timestamp();
    v_refused text[];
    v_modes text[];
    v_expired boolean;
    v_stale_markers boolean;
    v_written bigint;
BEGIN
    -- Create the missing node rows and lock all of them, in one order.
    INSERT INTO esdlock_node (id, namespace, kind, key, parent, depth)
    SELECT n.id, n.namespace, n.kind, n.key, n.parent, n.depth
    FROM unnest(p_ids, p_namespaces, p_kinds, p_keys, p_parents, p_depths)
        AS n(id, namespace, kind, key, parent, depth)
    ORDER BY n.id COLLATE "C"
    ON CONFLICT (id) DO UPDATE SET depth = EXCLUDED.depth WHERE false;

    -- Judge each node. A holder counts if live or awaiting recovery (it has
    -- an intent); the request's own holder id never counts (a retry). A
    -- reentrant request skips a node its owner holds live in the same mode.
    -- A live marker of another request in a conflicting mode refuses a
    -- request queued after it, unless the requester's owner holds the node.
    WITH asked AS (
        SELECT a.node_id, a.mode, string_to_array(a.conflicts, ',') AS conflicts
        FROM unnest(p_ids, p_modes, p_conflicts) AS a(node_id, mode, conflicts)
    ), judged AS (
        SELECT a.node_id, a.mode,
            p_reentrant AND EXISTS (
                SELECT 1 FROM esdlock_holder h
                WHERE h.node_id = a.node_id AND h.holder_id <> p_holder_id AND h.expires_at > v_now
                  AND h.owner_key = p_owner_key AND h.mode = a.mode
            ) AS reentered,
            EXISTS (
                SELECT 1 FROM esdlock_holder h
                WHERE h.node_id = a.node_id AND h.holder_id <> p_holder_id
                  AND (h.expires_at > v_now OR h.intent IS NOT NULL) AND h.mode = ANY(a.conflicts)
            ) OR (
                EXISTS (
                    SELECT 1 FROM esdlock_waiter w
                    WHERE w.node_id = a.node_id AND w.holder_id <> p_holder_id AND w.expires_at > v_now
                      AND w.mode = ANY(a.conflicts) AND (p_ticket IS NULL OR w.ticket < p_ticket)
                ) AND NOT EXISTS (
                    SELECT 1 FROM esdlock_holder h
                    WHERE h.node_id = a.node_id AND h.holder_id <> p_holder_id AND h.expires_at > v_now
                      AND h.owner_key = p_owner_key
                )
            ) AS blocked,
            EXISTS (
                SELECT 1 FROM esdlock_holder h
                WHERE h.node_id = a.node_id AND h.holder_id <> p_holder_id AND h.intent IS NULL
                  AND h.expires_at <= v_now
            ) AS expired,
            EXISTS (
                SELECT 1 FROM esdlock_waiter w
                WHERE w.node_id = a.node_id AND (w.holder_id = p_holder_id OR w.expires_at <= v_now)
            ) AS stale_markers
        FROM asked a
    )
    SELECT array_agg(node_id) FILTER (WHERE blocked AND NOT reentered),
           array_agg(node_id) FILTER (WHERE NOT reentered),
           array_agg(mode) FILTER (WHERE NOT reentered),
           bool_or(expired), bool_or(stale_markers)
    INTO v_refused, taken, v_modes, v_expired, v_stale_markers
    FROM judged;

    IF v_refused IS NOT NULL THEN
        -- Refused: a queued request leaves its markers on the nodes that
        -- refused it, or renews those past half their lease. Only then is
        -- there anything to commit (`wrote`; the caller rolls back
        -- otherwise), and node rows this call created go again.
        taken := NULL;
        wrote := false;
        IF p_ticket IS NOT NULL THEN
            INSERT INTO esdlock_waiter AS w (node_id, holder_id, mode, ticket, expires_at)
            SELECT r.node_id, p_holder_id, a.mode, p_ticket, v_now + p_marker_ttl_ms * interval '1 millisecond'
            FROM unnest(v_refused) AS r(node_id)
            JOIN unnest(p_ids, p_modes) AS a(node_id, mode) ON a.node_id = r.node_id
            ON CONFLICT (node_id, holder_id) DO UPDATE
                SET mode = EXCLUDED.mode, ticket = EXCLUDED.ticket, expires_at = EXCLUDED.expires_at
                WHERE w.expires_at < v_now + p_marker_ttl_ms / 2 * interval '1 millisecond'
                   OR w.mode <> EXCLUDED.mode OR w.ticket <> EXCLUDED.ticket;
            GET DIAGNOSTICS v_written = ROW_COUNT;
            IF v_written > 0 THEN
                wrote := true;
                DELETE FROM esdlock_node n
                WHERE n.id = ANY(p_ids) AND NOT EXISTS (SELECT 1 FROM esdlock_holder h WHERE h.node_id = n.id);
            END IF;
        END IF;
        RETURN;
    END IF;

    -- Granted: evict expired holders without an intent, drop this request's
    -- markers and expired ones, take a fencing token (after the node locks:
    -- it exceeds the token of every grant committed on these nodes before)
    -- and write one holder per taken node; a retried request replaces its
    -- earlier holder, never doubles it.
    IF v_expired THEN
        DELETE FROM esdlock_holder
        WHERE node_id = ANY(p_ids) AND holder_id <> p_holder_id AND intent IS NULL AND expires_at <= v_now;
    END IF;
    IF v_stale_markers THEN
        DELETE FROM esdlock_waiter
        WHERE node_id = ANY(p_ids) AND (holder_id = p_holder_id OR expires_at <= v_now);
    END IF;
    token := nextval('esdlock_token_seq');
    INSERT INTO esdlock_holder
        (node_id, holder_id, mode, owner, owner_key, token, acquired_at, expires_at, intent, checkpoint, recovery)
    SELECT t.node_id, p_holder_id, t.mode, p_owner, p_owner_key, token, v_now,
           v_now + p_ttl_ms * interval '1 millisecond', p_intent, NULL, NULL
    FROM unnest(taken, v_modes) AS t(node_id, mode)
    ON CONFLICT (node_id, holder_id) DO UPDATE SET
        mode = EXCLUDED.mode, owner = EXCLUDED.owner, owner_key = EXCLUDED.owner_key, token = EXCLUDED.token,
        acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at, intent = EXCLUDED.intent,
        checkpoint = NULL, recovery = NULL;
    taken := coalesce(taken, '{}');
    wrote := true;
END
$$
