"""PostgreSQL: a release of a grant without intent commits without waiting for the WAL flush; markers may name
a channel set on the session; a release names the waiter it wakes.

- ``esdlock_release`` of a grant that has no intent sets ``synchronous_commit``
  off for its own transaction. Giving a lock back need not survive a crash:
  a release lost with the server's last unflushed WAL only leaves the grant
  to its lease, like a dead holder, and no later grant can be acknowledged
  before it (the grant's own flush covers every earlier WAL record, the
  release included). A grant with an intent is released durably: losing
  that release would run the recovery of a change that finished.
- ``esdlock_acquire`` names in a waiting marker the channel of the session
  setting ``esdlock.channel`` if set, else ``esdlock_<backend pid>`` as
  before: an async client runs its calls on pooled sessions and listens on
  one session of its own, whose channel it sets on the others.
- ``esdlock_release`` sends each waiter it may free the waiter's holder id
  as the payload, so a session that listens for many requests (the async
  client's) wakes only that one; a blocking session ignores the payload.
"""

from importlib import import_module

from django.db import migrations

_previous = import_module("django_esdlock.migrations.0003_grants_persistent_nodes")

_OWN_CHANNEL = "'esdlock_' || pg_backend_pid()"
_SET_CHANNEL = "coalesce(nullif(current_setting('esdlock.channel', true), ''), 'esdlock_' || pg_backend_pid())"

ACQUIRE_FUNCTION = _previous.ACQUIRE_FUNCTION.replace(_OWN_CHANNEL, _SET_CHANNEL)
assert ACQUIRE_FUNCTION.count(_SET_CHANNEL) == 1

RELEASE_FUNCTION = r"""
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
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE_FUNCTION)
        schema_editor.execute(RELEASE_FUNCTION)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_previous.ACQUIRE_FUNCTION)
        schema_editor.execute(_previous.RELEASE_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("django_esdlock", "0003_grants_persistent_nodes")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
