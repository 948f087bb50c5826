"""Waiting markers name their owner, so any process can build the wait-for graph from the store.

- ``esdlock_waiter.owner``: the owner fields of the waiting request, as its
  grant would record them (``key`` among them). Markers of an older release
  have none; they expire within seconds.
- PostgreSQL: ``esdlock_acquire`` writes ``p_owner`` into the markers it
  leaves. Nothing else of the function changes.
"""

from importlib import import_module

from django.db import migrations, models

_previous = import_module("django_esdlock.migrations.0004_release_without_flush_channel_setting")

_COLUMNS = "INSERT INTO esdlock_waiter AS w (node_id, holder_id, mode, ticket, expires_at, channel)"
_VALUES = f"{_previous._SET_CHANNEL}\n            FROM unnest(v_refused) AS r(node_id)"

ACQUIRE_FUNCTION = _previous.ACQUIRE_FUNCTION.replace(_COLUMNS, _COLUMNS[:-1] + ", owner)").replace(
    _VALUES, _VALUES.replace(_previous._SET_CHANNEL, _previous._SET_CHANNEL + ", p_owner")
)
assert ACQUIRE_FUNCTION.count(", owner)") == 1 and ACQUIRE_FUNCTION.count(", p_owner\n") == 1


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE_FUNCTION)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_previous.ACQUIRE_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("django_esdlock", "0004_release_without_flush_channel_setting")]

    operations = [
        migrations.AddField(
            model_name="lockwaiter",
            name="owner",
            field=models.JSONField(
                blank=True,
                help_text="Who waits: the owner fields a holder records (the wait-for graph's edges)",
                null=True,
            ),
        ),
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
