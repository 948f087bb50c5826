"""Fenced writes through the ORM: rows refuse a holder whose token is older than the one that wrote them last.

:func:`fenced_update` is one ``UPDATE`` statement::

    UPDATE t SET v = %s, fence = CASE WHEN fence <= %(token)s THEN %(token)s ELSE NULL END WHERE <queryset>

A row that carries a newer token gets NULL in its NOT NULL fence column, so
the database aborts the whole statement: no row of it is written. One
statement is atomic on every database Django supports (PostgreSQL and SQLite
undo a failed statement whole and keep the transaction usable up to it). It
is also the newest state each row is judged on, not a snapshot read earlier:
PostgreSQL computes ``SET`` on the row version it locked (a row another
transaction changed meanwhile is re-read once that one commits, READ
COMMITTED's "EvalPlanQual"), and SQLite runs one writer at a time. So no
read-then-write gap exists for another holder to slip into, and no
``select_for_update`` is needed. Only the refusal path costs more: the
aborted statement is followed by one query for the newer token.

MySQL needs strict mode (Django's check ``mysql.W002``): outside it, NULL into
a NOT NULL column is stored as 0 instead of aborting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import FieldDoesNotExist
from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import F, Max

from ..exceptions import InvalidLockArgument, StaleFence
from .tokens import fence_token


class FenceField(models.BigIntegerField):
    """The newest fencing token that wrote the row (0: none yet), kept by the fencing helpers.

    ``namespace`` names the lock namespace whose tokens guard the rows: a
    Lock of another namespace passed to a helper is refused. Never null (the
    refusal of a stale write relies on it), not editable in forms.
    """

    description = "Fencing token of the newest write"

    def __init__(self, *args: Any, namespace: str | None = None, **kwargs: Any) -> None:
        if kwargs.get("null"):
            raise InvalidLockArgument("a FenceField cannot be null: a stale write is refused by its NOT NULL")
        kwargs.setdefault("default", 0)
        kwargs.setdefault("editable", False)
        self.namespace = namespace
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> tuple[str, str, list[Any], dict[str, Any]]:
        name, _, args, kwargs = super().deconstruct()
        if kwargs.get("default") == 0:
            del kwargs["default"]
        if kwargs.get("editable") is False:
            del kwargs["editable"]
        if self.namespace is not None:
            kwargs["namespace"] = self.namespace
        return name, "django_esdlock.fencing.FenceField", args, kwargs


class _Stamp(models.Expression):
    """``CASE WHEN <fence> <= token THEN token ELSE NULL END``: the token, or NULL (refused) for a newer row.

    Written out rather than built from ``Case``/``When``/``Q``: the same SQL,
    a fraction of their compile time, which a one-row update on a fast store
    notices. The token goes as a query parameter.
    """

    output_field = models.BigIntegerField()  # one for every stamp: a Field is costly to make

    def __init__(self, fence: FenceField, token: int) -> None:
        super().__init__()
        self.fence: Any = F(fence.name)
        self.token = token

    def get_source_expressions(self) -> list[Any]:
        return [self.fence]

    def set_source_expressions(self, exprs: list[Any]) -> None:
        (self.fence,) = exprs

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        sql, params = compiler.compile(self.fence)
        return f"CASE WHEN {sql} <= %s THEN %s ELSE NULL END", (*params, self.token, self.token)


def fence_field(model: type[models.Model]) -> FenceField:
    """Return ``model``'s one FenceField; InvalidLockArgument if it has none or several."""
    # The table's own fields only: a parent's fence (multi-table inheritance) would be a second UPDATE.
    found = [f for f in model._meta.concrete_model._meta.local_concrete_fields if isinstance(f, FenceField)]
    if len(found) != 1:
        raise InvalidLockArgument(
            f"{model._meta.label} has {len(found)} FenceFields; a fenced write needs exactly one "
            "(add fence = FenceField() to the model)"
        )
    return found[0]


def _local_names(model: type[models.Model], names: Iterable[str], fence: FenceField) -> None:
    """Refuse a value for the fence itself, or for a field of a parent model (a second UPDATE statement)."""
    meta = model._meta
    for name in names:
        try:
            field = meta.get_field(name)
        except FieldDoesNotExist as e:
            raise InvalidLockArgument(f"{meta.label} has no field {name!r}") from e
        if field is fence:
            raise InvalidLockArgument(f"{fence.name} is the fence: the fenced write sets it to the token")
        if getattr(field, "model", model)._meta.concrete_model is not meta.concrete_model:
            raise InvalidLockArgument(
                f"{name!r} is a field of {field.model._meta.label}, another table: a fenced write is one statement"
            )


def _savepoint_if_in_transaction(using: str) -> contextlib.AbstractContextManager[Any]:
    """A savepoint inside a transaction (PostgreSQL's would be aborted by the refusal); nothing in autocommit,
    where the statement is a transaction of its own."""
    if connections[using].in_atomic_block:
        return transaction.atomic(using=using, savepoint=True)
    return contextlib.nullcontext()


def _refused(queryset: models.QuerySet[Any], fence: FenceField, token: int) -> StaleFence | None:
    """Return the StaleFence naming the newest token above ``token`` in ``queryset``, or None if there is none."""
    newer = queryset.filter(**{f"{fence.name}__gt": token}).aggregate(newest=Max(fence.name))["newest"]
    if newer is None:
        return None
    return StaleFence(
        f"{queryset.model._meta.label}: a row carries fencing token {newer}, newer than {token}: "
        "a newer holder of the lock wrote there; nothing was written",
        token=token,
        newer=newer,
    )


def fenced_update(queryset: models.QuerySet[Any], lock_or_token: Any, **values: Any) -> int:
    """Write ``values`` and the token into every row of ``queryset``, all or nothing; return how many rows.

    Raise :exc:`~django_esdlock.StaleFence` (nothing written) if a row carries
    a newer token than ``lock_or_token``'s. A Lock is checked first
    (:exc:`~django_esdlock.LockLost`) and must be of the FenceField's
    namespace; a bare int is used as it is. Bad input raises
    :exc:`~django_esdlock.InvalidLockArgument` before anything is sent.
    ``values`` are what :meth:`QuerySet.update() <django.db.models.query.QuerySet.update>`
    takes (``F()`` expressions included), on the model's own table.
    """
    model = queryset.model
    fence = fence_field(model)
    _local_names(model, values, fence)
    token = fence_token(lock_or_token, namespace=fence.namespace)
    stamp = _Stamp(fence, token)
    using = queryset.db
    try:
        with _savepoint_if_in_transaction(using):
            return queryset.update(**values, **{fence.name: stamp})
    except IntegrityError as e:
        refused = _refused(queryset, fence, token)
        if refused is None:
            raise  # the values broke a constraint: not a fence's refusal
        raise refused from e


def fenced_save(
    instance: models.Model,
    lock_or_token: Any,
    update_fields: Iterable[str] | None = None,
    *,
    using: str | None = None,
) -> None:
    """Save ``instance`` fenced: update its row unless it carries a newer token, or insert it if there is none.

    Like :func:`fenced_update` for the row of ``instance.pk`` (its concrete
    fields, or ``update_fields``); the fence of ``instance`` is set to the
    token once written. An insert that loses a race to a concurrent one
    (the primary key taken meanwhile) becomes the fenced update of that row.
    ``using`` is the database, as for ``save()`` (default: the instance's, or the router's). An update sends no
    signals, as :meth:`QuerySet.update() <django.db.models.query.QuerySet.update>`; an insert is a
    ``save(force_insert=True)``.
    """
    model = type(instance)
    meta = model._meta
    fence = fence_field(model)
    if meta.concrete_model._meta.parents:
        raise InvalidLockArgument(f"{meta.label} inherits a table: fenced_save writes one table")
    if update_fields is not None:
        update_fields = list(update_fields)
        _local_names(model, update_fields, fence)
    token = fence_token(lock_or_token, namespace=fence.namespace)
    using = using or instance._state.db or router.db_for_write(model, instance=instance)
    table_fields = meta.concrete_model._meta.local_concrete_fields  # a proxy's are its concrete model's
    fields = [f for f in table_fields if not f.primary_key and f is not fence]
    if update_fields is not None:
        fields = [f for f in fields if f.name in update_fields or f.attname in update_fields]

    def update() -> int:
        values = {f.attname: f.pre_save(instance, False) for f in fields}
        return fenced_update(model._base_manager.using(using).filter(pk=instance.pk), token, **values)

    if instance.pk is not None and update():
        setattr(instance, fence.attname, token)
        return
    setattr(instance, fence.attname, token)
    try:
        with transaction.atomic(using=using, savepoint=True):
            instance.save(using=using, force_insert=True)
    except IntegrityError:
        # A concurrent insert took the primary key (or the values break a constraint): update, fenced.
        if instance.pk is None or not update():
            raise
        return


async def afenced_update(queryset: models.QuerySet[Any], lock_or_token: Any, **values: Any) -> int:
    """Async :func:`fenced_update`, run in Django's thread for database work (``sync_to_async``)."""
    return await sync_to_async(fenced_update)(queryset, lock_or_token, **values)


async def afenced_save(
    instance: models.Model,
    lock_or_token: Any,
    update_fields: Iterable[str] | None = None,
    *,
    using: str | None = None,
) -> None:
    """Async :func:`fenced_save`, run in Django's thread for database work (``sync_to_async``)."""
    await sync_to_async(fenced_save)(instance, lock_or_token, update_fields, using=using)
