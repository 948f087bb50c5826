"""A reentrant request names the nodes it may count as taken: those a lock of its thread or task holds.

- PostgreSQL: ``esdlock_acquire(..., p_reentrant text[], ...)`` skips a node
  its owner holds live in the same mode only if the node's id is in
  ``p_reentrant``. With the boolean of 0002-0005, any node of a reentrant
  request was skipped so: an entry of this owner that no lock holds (a release
  that never reached the store) made a grant with no entry of its own on it.
  The boolean overload stays, so the processes of the previous release keep
  working through a rolling deploy; nothing else of the function changes.
"""

from django.db import migrations

from django_esdlock.backends.database.postgresql.functions import function_sql

ACQUIRE_FUNCTION = function_sql("esdlock_acquire", 5)

DROP_ACQUIRE_FUNCTION = (
    "DROP FUNCTION IF EXISTS esdlock_acquire(text[], text[], text[], text[], text[], int[], text[], text[], text, "
    "jsonb, text, float8, jsonb, text[], bigint, float8)"
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE_FUNCTION)  # an overload: the boolean one stays


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_ACQUIRE_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("django_esdlock", "0005_waiter_owner")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
