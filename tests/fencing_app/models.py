"""Rows guarded by fencing tokens (tests/test_fencing*.py), and models the helpers must refuse."""

from django.db import models

from django_esdlock.fencing import FenceField

NAMESPACE = "fence-tests"
"""The lock namespace whose tokens guard :class:`Account` rows."""


class Account(models.Model):
    """A row a lock holder writes: ``FenceField(namespace=...)`` refuses locks of other namespaces."""

    name = models.CharField(max_length=50, unique=True)
    balance = models.IntegerField(default=0)
    note = models.CharField(max_length=50, blank=True, default="")
    fence = FenceField(namespace=NAMESPACE)

    def __str__(self) -> str:
        return self.name


class Ledger(models.Model):
    """A row guarded by tokens of any namespace (no ``namespace``: not checked)."""

    entry = models.CharField(max_length=50)
    written = FenceField()

    def __str__(self) -> str:
        return self.entry


class Unfenced(models.Model):
    """No FenceField: the helpers refuse it."""

    value = models.IntegerField(default=0)

    def __str__(self) -> str:
        return str(self.value)


class TwoFences(models.Model):
    """Two FenceFields: the helpers cannot tell which one is the fence, and refuse it."""

    first = FenceField()
    second = FenceField()

    def __str__(self) -> str:
        return str(self.pk)
