-- esdlock_acquire v7 (migration 0008): v6 with p_holder_limit, a semaphore's limit (its request has one node):
-- the node takes a holder only while its counting grants and the live markers queued before the request (any
-- mode; none where the requester's owner holds the node) number fewer than the limit that stands there: the
-- node's holder_limit while any grant counts, else p_holder_limit; a grant records it again, returns it (OUT
-- holder_limit) and wakes the next waiters while slots are left. NULL for every other lock: v6's rules alone.
-- An overload: v6 and v5 stay. Current.
CREATE OR REPLACE FUNCTION esdlock_acquire(
    p_ids text[], p_namespaces text[], p_kinds text[], p_keys text[], p_parents text[], p_depths int[],
    p_modes text[], p_conflicts text[], p_holder_id text, p_owner jsonb, p_owner_key text, p_ttl_ms float8,
    p_intent jsonb, p_reentrant text[], p_ticket bigint, p_marker_ttl_ms float8, p_lock_delay_ms float8,
    p_holder_limit int, OUT token bigint, OUT taken text[], OUT holder_limit int
) LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now timestamptz := statement_timestamp();
    v_cut timestamptz := statement_timestamp() - p_lock_delay_ms * interval '1 millisecond';
    v_refused text[];
    v_modes text[];
    v_blockers text[];
    v_expired text[];
    v_expired_conflicting text[];
    v_evicted text[];
    v_stale_markers boolean;
    v_has_expired boolean;
    v_held_blocked boolean;
    v_count bigint;
    v_standing int;
    v_counting bigint;
BEGIN
    -- Create the missing node rows and lock all of them, in one order.
    INSERT INTO esdlock_node AS n (id, namespace, kind, key, parent, depth, entries)
    SELECT a.id, a.namespace, a.kind, a.key, a.parent, a.depth, '{}'::jsonb
    FROM unnest(p_ids, p_namespaces, p_kinds, p_keys, p_parents, p_depths)
        AS a(id, namespace, kind, key, parent, depth)
    ORDER BY a.id COLLATE "C"
    ON CONFLICT (id) DO UPDATE SET depth = EXCLUDED.depth WHERE false;

    FOR v_round IN 1..3 LOOP
        -- Judge each node, one pass over its entries and one index probe of
        -- its markers. A grant counts if live, ended less than the lock
        -- delay ago, or awaiting recovery (it has an intent); the request's
        -- own holder id never counts (a retry). A
        -- reentrant request skips a node its owner holds live in the same
        -- mode. A live marker of another request in a conflicting mode
        -- refuses a request queued after it, unless the requester's owner
        -- holds the node.
        SELECT array_agg(j.node_id) FILTER (WHERE j.blocked AND NOT j.reentered),
               array_agg(j.node_id) FILTER (WHERE NOT j.reentered),
               array_agg(j.mode) FILTER (WHERE NOT j.reentered),
               coalesce(bool_or(j.stale_markers), false),
               coalesce(bool_or(j.expired), false),
               coalesce(bool_or(j.held_blocked AND NOT j.reentered), false),
               max(j.standing), max(j.counting)
        INTO v_refused, taken, v_modes, v_stale_markers, v_has_expired, v_held_blocked, v_standing, v_counting
        FROM (
            SELECT a.node_id, a.mode,
                   a.node_id = ANY(p_reentrant) AND coalesce(h.reentered, false) AS reentered,
                   coalesce(h.blocked, false) OR s.full AS held_blocked,
                   coalesce(h.blocked, false) OR (coalesce(m.queued, false) AND NOT coalesce(h.inside, false))
                       OR s.full OR s.queued_full AS blocked,
                   coalesce(m.stale, false) AS stale_markers,
                   coalesce(h.expired, false) AS expired,
                   s.standing, h.counting
            FROM unnest(p_ids, p_modes, p_conflicts) AS a(node_id, mode, conflicts)
            JOIN esdlock_node n ON n.id = a.node_id
            CROSS JOIN LATERAL (
                SELECT bool_or(g.expires_at > v_now AND g.owner_key = p_owner_key AND e.value = a.mode) AS reentered,
                       bool_or((g.expires_at > v_cut OR g.intent IS NOT NULL)
                               AND e.value = ANY(string_to_array(a.conflicts, ','))) AS blocked,
                       bool_or(g.expires_at > v_now AND g.owner_key = p_owner_key) AS inside,
                       bool_or(g.expires_at <= v_cut AND g.intent IS NULL) AS expired,
                       count(*) FILTER (WHERE g.expires_at > v_cut OR g.intent IS NOT NULL) AS counting
                FROM jsonb_each_text(coalesce(n.entries, '{}'::jsonb)) AS e
                JOIN esdlock_grant g ON g.holder_id = e.key
                WHERE e.key <> p_holder_id
            ) h
            CROSS JOIN LATERAL (
                SELECT bool_or(w.holder_id <> p_holder_id AND w.expires_at > v_now
                               AND w.mode = ANY(string_to_array(a.conflicts, ','))
                               AND (p_ticket IS NULL OR w.ticket < p_ticket)) AS queued,
                       bool_or(w.holder_id = p_holder_id OR w.expires_at <= v_now) AS stale,
                       count(*) FILTER (WHERE w.holder_id <> p_holder_id AND w.expires_at > v_now
                                        AND (p_ticket IS NULL OR w.ticket < p_ticket)) AS ahead
                FROM esdlock_waiter w WHERE w.node_id = a.node_id
            ) m
            -- A semaphore (p_holder_limit): full when its counting grants reach the standing limit, or
            -- when they and the markers queued before this request do (none count where it is inside).
            CROSS JOIN LATERAL (
                SELECT l.standing,
                       p_holder_limit IS NOT NULL AND h.counting >= l.standing AS full,
                       p_holder_limit IS NOT NULL AND NOT coalesce(h.inside, false)
                           AND h.counting + m.ahead >= l.standing AS queued_full
                FROM (SELECT CASE WHEN h.counting > 0 AND n.holder_limit IS NOT NULL THEN n.holder_limit
                                  ELSE p_holder_limit END AS standing) l
            ) s
        ) j;

        IF v_refused IS NULL AND v_has_expired THEN
            -- Evict the expired grants (no intent) met here, re-checking each
            -- row's lease as it is deleted: one renewed meanwhile stays, and
            -- if it conflicts the request is judged again.
            SELECT array_agg(DISTINCT e.key),
                   array_agg(DISTINCT e.key) FILTER (WHERE e.value = ANY(string_to_array(a.conflicts, ','))
                                                     OR p_holder_limit IS NOT NULL)
            INTO v_expired, v_expired_conflicting
            FROM unnest(p_ids, p_conflicts) AS a(node_id, conflicts)
            JOIN esdlock_node n ON n.id = a.node_id
            CROSS JOIN LATERAL jsonb_each_text(coalesce(n.entries, '{}'::jsonb)) AS e
            JOIN esdlock_grant g ON g.holder_id = e.key
            WHERE e.key <> p_holder_id AND g.expires_at <= v_cut AND g.intent IS NULL;
            PERFORM 1 FROM esdlock_grant WHERE holder_id = ANY(v_expired)
            ORDER BY holder_id COLLATE "C" FOR UPDATE;
            WITH gone AS (
                DELETE FROM esdlock_grant
                WHERE holder_id = ANY(v_expired) AND intent IS NULL AND expires_at <= v_cut
                RETURNING holder_id
            )
            SELECT array_agg(holder_id) INTO v_evicted FROM gone;
            IF v_expired_conflicting IS NOT NULL
               AND NOT (v_expired_conflicting <@ coalesce(v_evicted, '{}'::text[])) THEN
                CONTINUE;
            END IF;
        END IF;

        IF v_refused IS NOT NULL THEN
            taken := NULL;
            IF p_ticket IS NULL THEN
                RETURN;
            END IF;
            INSERT INTO esdlock_waiter AS w (node_id, holder_id, mode, ticket, expires_at, channel, owner)
            SELECT r.node_id, p_holder_id, a.mode, p_ticket, v_now + p_marker_ttl_ms * interval '1 millisecond',
                   coalesce(nullif(current_setting('esdlock.channel', true), ''), 'esdlock_' || pg_backend_pid()), p_owner
            FROM unnest(v_refused) AS r(node_id)
            JOIN unnest(p_ids, p_modes) AS a(node_id, mode) ON a.node_id = r.node_id
            ON CONFLICT (node_id, holder_id) DO UPDATE
                SET mode = EXCLUDED.mode, ticket = EXCLUDED.ticket, expires_at = EXCLUDED.expires_at,
                    channel = EXCLUDED.channel
                WHERE w.expires_at < v_now + p_marker_ttl_ms / 2 * interval '1 millisecond'
                   OR w.mode <> EXCLUDED.mode OR w.ticket <> EXCLUDED.ticket
                   OR w.channel <> EXCLUDED.channel;
            GET DIAGNOSTICS v_count = ROW_COUNT;
            IF v_count > 0 THEN
                SELECT array_agg(DISTINCT e.key) INTO v_blockers
                FROM unnest(p_ids, p_conflicts) AS a(node_id, conflicts)
                JOIN esdlock_node n ON n.id = a.node_id
                CROSS JOIN LATERAL jsonb_each_text(coalesce(n.entries, '{}'::jsonb)) AS e
                JOIN esdlock_grant g ON g.holder_id = e.key
                WHERE e.key <> p_holder_id
                  AND (e.value = ANY(string_to_array(a.conflicts, ',')) OR p_holder_limit IS NOT NULL)
                  AND (g.expires_at > v_cut OR g.intent IS NOT NULL);
                IF v_held_blocked THEN
                    -- A grant that refused us and went before this lock may
                    -- not have seen the marker: judge again rather than wait.
                    IF v_blockers IS NULL THEN
                        CONTINUE;
                    END IF;
                    PERFORM 1 FROM esdlock_grant WHERE holder_id = ANY(v_blockers)
                    ORDER BY holder_id COLLATE "C" FOR KEY SHARE;
                    GET DIAGNOSTICS v_count = ROW_COUNT;
                    IF v_count < cardinality(v_blockers) THEN
                        CONTINUE;
                    END IF;
                END IF;
                -- Only markers and row locks to commit: no need to wait for the
                -- WAL flush (set here, never before a grant in this call).
                PERFORM set_config('synchronous_commit', 'off', true);
            END IF;
            RETURN;
        END IF;

        -- Granted: drop this request's markers and expired ones, take a
        -- fencing token (after the node locks: it exceeds the token of every
        -- grant committed on these nodes before), add this holder to each
        -- taken node's entries (dropping entries whose grant is gone) and
        -- write the grant; a retried request replaces its earlier grant.
        IF v_stale_markers THEN
            DELETE FROM esdlock_waiter
            WHERE node_id = ANY(p_ids) AND (holder_id = p_holder_id OR expires_at <= v_now);
        END IF;
        token := nextval('esdlock_token_seq');
        holder_limit := v_standing;
        taken := coalesce(taken, '{}'::text[]);
        IF cardinality(taken) = 0 THEN
            RETURN;
        END IF;
        WITH entered AS (
            UPDATE esdlock_node n
            SET entries = (
                SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
                FROM jsonb_each_text(coalesce(n.entries, '{}'::jsonb)) AS e
                WHERE e.key <> p_holder_id AND EXISTS (SELECT 1 FROM esdlock_grant g WHERE g.holder_id = e.key)
            ) || jsonb_build_object(p_holder_id, t.mode),
                holder_limit = coalesce(v_standing, n.holder_limit)
            FROM unnest(taken, v_modes) AS t(node_id, mode)
            WHERE n.id = t.node_id
        )
        INSERT INTO esdlock_grant AS g
            (holder_id, nodes, owner, owner_key, token, acquired_at, expires_at, intent, checkpoint, recovery)
        SELECT p_holder_id, jsonb_object_agg(t.node_id, t.mode), p_owner, p_owner_key, token, v_now,
               v_now + p_ttl_ms * interval '1 millisecond', p_intent, NULL, NULL
        FROM unnest(taken, v_modes) AS t(node_id, mode)
        ON CONFLICT (holder_id) DO UPDATE SET
            nodes = EXCLUDED.nodes, owner = EXCLUDED.owner, owner_key = EXCLUDED.owner_key, token = EXCLUDED.token,
            acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at, intent = EXCLUDED.intent,
            checkpoint = NULL, recovery = NULL;
        IF v_standing IS NOT NULL AND v_counting + 1 < v_standing THEN
            -- Slots are left: wake the next waiters in order (a release wakes the head of the queue alone,
            -- and two releases before it tries again would leave the second's slot to a poll).
            PERFORM pg_notify(w.channel, w.holder_id) FROM (
                SELECT q.channel, q.holder_id FROM esdlock_waiter q
                WHERE q.node_id = ANY(p_ids) AND q.holder_id <> p_holder_id AND q.expires_at > v_now
                  AND q.channel <> ''
                ORDER BY q.ticket LIMIT v_standing - v_counting - 1
            ) w;
        END IF;
        RETURN;
    END LOOP;
    token := NULL;  -- judged three times, refused by grants that kept changing: the client tries again
    taken := NULL;
END
$$
