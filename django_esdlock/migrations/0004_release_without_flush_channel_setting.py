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

from django.db import migrations

from django_esdlock.backends.database.postgresql.functions import function_sql

ACQUIRE_FUNCTION = function_sql("esdlock_acquire", 3)
RELEASE_FUNCTION = function_sql("esdlock_release", 3)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACQUIRE_FUNCTION)
        schema_editor.execute(RELEASE_FUNCTION)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(function_sql("esdlock_acquire", 2))
        schema_editor.execute(function_sql("esdlock_release", 2))


class Migration(migrations.Migration):
    dependencies = [("django_esdlock", "0003_grants_persistent_nodes")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
