"""The lock delay: a grant whose lease ended less than ``p_lock_delay_ms`` ago still counts, and is not evicted.

- PostgreSQL: ``esdlock_acquire(..., p_marker_ttl_ms float8, p_lock_delay_ms
  float8)``, v6, an overload: v5 (and v4) stay, so the processes of the
  previous release keep working through a rolling deploy; they judge with no
  delay. SQLite judges in its statements: nothing to install.
"""

from django.db import migrations

from django_esdlock.backends.database.postgresql.functions import function_sql

ACQUIRE_FUNCTION = function_sql("esdlock_acquire", 6)

DROP_ACQUIRE_FUNCTION = (
    "DROP FUNCTION IF EXISTS esdlock_acquire(text[], text[], text[], text[], text[], int[], text[], text[], text, "
    "jsonb, text, float8, jsonb, text[], bigint, float8, float8)"
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE_FUNCTION)  # an overload: v5 stays


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_ACQUIRE_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("django_esdlock", "0006_reentry_per_node")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
