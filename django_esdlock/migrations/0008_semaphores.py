"""Semaphores: a node records the limit its holders were granted under, and acquire judges a semaphore's request.

- Both vendors: ``esdlock_node.holder_limit`` (null for every other lock).
- PostgreSQL: ``esdlock_acquire`` v7, an overload with ``p_holder_limit``
  (and ``OUT holder_limit``); v6 and v5 stay, so the processes of the previous
  release keep working through a rolling deploy.
"""

from django.db import migrations, models

from django_esdlock.backends.database.postgresql.functions import function_sql

ACQUIRE_FUNCTION = function_sql("esdlock_acquire", 7)

DROP_ACQUIRE_FUNCTION = (
    "DROP FUNCTION IF EXISTS esdlock_acquire(text[], text[], text[], text[], text[], int[], text[], text[], text, "
    "jsonb, text, float8, jsonb, text[], bigint, float8, float8, int)"
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE_FUNCTION)  # an overload: v6 and v5 stay


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_ACQUIRE_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("django_esdlock", "0007_lock_delay")]

    operations = [
        migrations.AddField(
            model_name="locknode",
            name="holder_limit",
            field=models.PositiveIntegerField(
                blank=True, help_text="A semaphore's: the limit its holders were granted under", null=True
            ),
        ),
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
