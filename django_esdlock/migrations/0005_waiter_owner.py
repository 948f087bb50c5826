"""Waiting markers name their owner, so any process can build the wait-for graph from the store.

- ``esdlock_waiter.owner``: the owner fields of the waiting request, as its
  grant would record them (``key`` among them). Markers of an older release
  have none; they expire within seconds.
- PostgreSQL: ``esdlock_acquire`` writes ``p_owner`` into the markers it
  leaves. Nothing else of the function changes.
"""

from django.db import migrations, models

from django_esdlock.backends.database.postgresql.functions import function_sql

ACQUIRE_FUNCTION = function_sql("esdlock_acquire", 4)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE_FUNCTION)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(function_sql("esdlock_acquire", 3))


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
