"""Fenced ORM writes on SQLite and PostgreSQL: newer tokens refuse older ones, all or nothing, bad input no write."""

from __future__ import annotations

import asyncio
import pickle
import random
import threading

import pytest
from asgiref.sync import sync_to_async
from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.migrations.writer import MigrationWriter
from django.db.models import F

from django_esdlock import InvalidLockArgument, LockLost, StaleFence, lock_tree
from django_esdlock.conf import load_backend
from django_esdlock.fencing import FenceField, afenced_save, afenced_update, fenced_save, fenced_update
from tests.contract import store_params
from tests.fencing_app.models import NAMESPACE, Account, Ledger, TwoFences, Unfenced

pytestmark = pytest.mark.django_db(databases=["default", "postgres"], transaction=True)


@pytest.fixture(params=[pytest.param("default", marks=pytest.mark.sqlite, id="sqlite"), *store_params("postgres")])
def alias(request):
    """The database the rows live in: ``default`` (SQLite) or ``postgres``."""
    return request.param


@pytest.fixture
def lock_backend(shared_stores, django_db_blocker):
    """A lock store (SQLite) apart from the data's database: locks and data need not share a store."""
    with django_db_blocker.unblock():
        backend = load_backend(shared_stores.get("sqlite"))
        yield backend
        backend.close()


def accounts(alias, *names, fence=0):
    return [Account.objects.using(alias).create(name=name, balance=10, fence=fence) for name in names]


def state(alias):
    return sorted(Account.objects.using(alias).values_list("name", "balance", "fence"))


def test_update_writes_values_and_token(alias):
    accounts(alias, "a", "b", fence=3)
    assert fenced_update(Account.objects.using(alias).all(), 5, balance=20) == 2
    assert state(alias) == [("a", 20, 5), ("b", 20, 5)]
    # The same token again, and F() expressions: a holder writes many times.
    assert fenced_update(Account.objects.using(alias).filter(name="a"), 5, balance=F("balance") + 1) == 1
    assert state(alias) == [("a", 21, 5), ("b", 20, 5)]


def test_a_newer_row_refuses_the_whole_update(alias):
    accounts(alias, "a", "b", "c", fence=3)
    Account.objects.using(alias).filter(name="b").update(fence=9)
    with pytest.raises(StaleFence, match="newer than 5") as refused:
        fenced_update(Account.objects.using(alias).all(), 5, balance=99, note="stale")
    assert (refused.value.token, refused.value.newer) == (5, 9)
    assert isinstance(refused.value, LockLost)
    assert state(alias) == [("a", 10, 3), ("b", 10, 9), ("c", 10, 3)]  # no row written, "a" and "c" neither


def test_refusal_inside_a_transaction_keeps_it_usable(alias):
    accounts(alias, "a", "b", fence=3)
    Account.objects.using(alias).filter(name="b").update(fence=9)
    with transaction.atomic(using=alias):
        Account.objects.using(alias).filter(name="a").update(note="before")
        with pytest.raises(StaleFence):
            fenced_update(Account.objects.using(alias).all(), 5, balance=99)
        Account.objects.using(alias).filter(name="a").update(note="after")  # PostgreSQL: not aborted
    assert Account.objects.using(alias).get(name="a").note == "after"
    assert state(alias) == [("a", 10, 3), ("b", 10, 9)]


def test_a_constraint_broken_by_the_values_is_not_a_refusal(alias):
    accounts(alias, "a", "b")
    with pytest.raises(IntegrityError):
        fenced_update(Account.objects.using(alias).filter(name="b"), 5, name="a")
    assert state(alias) == [("a", 10, 0), ("b", 10, 0)]


@pytest.mark.parametrize(
    "bad",
    [-1, 0, True, False, 2**63, 1.5, "7", None, object()],
    ids=["negative", "zero", "true", "false", "too-large", "float", "str", "none", "object"],
)
def test_bad_tokens_write_nothing(alias, bad):
    accounts(alias, "a")
    with pytest.raises(InvalidLockArgument):
        fenced_update(Account.objects.using(alias).all(), bad, balance=99)
    with pytest.raises(InvalidLockArgument):
        fenced_save(Account(name="new"), bad)
    assert state(alias) == [("a", 10, 0)]


def test_models_and_values_the_helpers_refuse(alias):
    accounts(alias, "a")
    with pytest.raises(InvalidLockArgument, match="0 FenceFields"):
        fenced_update(Unfenced.objects.using(alias).all(), 5, value=1)
    with pytest.raises(InvalidLockArgument, match="2 FenceFields"):
        fenced_update(TwoFences.objects.using(alias).all(), 5)
    with pytest.raises(InvalidLockArgument, match="is the fence"):
        fenced_update(Account.objects.using(alias).all(), 5, fence=1)
    with pytest.raises(InvalidLockArgument, match="no field"):
        fenced_update(Account.objects.using(alias).all(), 5, nope=1)
    with pytest.raises(InvalidLockArgument, match="cannot be null"):
        FenceField(null=True)
    assert state(alias) == [("a", 10, 0)]


def test_a_held_lock_gives_its_token_a_lost_one_writes_nothing(alias, lock_backend):
    accounts(alias, "a")
    with lock_tree("/accounts/a", namespace=NAMESPACE, backend=lock_backend) as lock:
        assert fenced_update(Account.objects.using(alias).all(), lock, balance=20) == 1
        token = lock.token
        assert state(alias) == [("a", 20, token)]
    with pytest.raises(LockLost, match="not held"):
        fenced_update(Account.objects.using(alias).all(), lock, balance=30)
    assert state(alias) == [("a", 20, token)]


def test_a_lock_of_another_namespace_is_refused(alias, lock_backend):
    accounts(alias, "a")
    with lock_tree("/accounts/a", namespace="elsewhere", backend=lock_backend) as lock:
        with pytest.raises(InvalidLockArgument, match=r"namespace 'elsewhere'.*'fence-tests'"):
            fenced_update(Account.objects.using(alias).all(), lock, balance=20)
        with pytest.raises(InvalidLockArgument, match="namespace"):
            fenced_save(Account(name="b"), lock)
        # A field without a namespace takes any lock's: the docs' rule is the user's to keep.
        Ledger.objects.using(alias).create(entry="x")
        assert fenced_update(Ledger.objects.using(alias).all(), lock, entry="y") == 1
    with lock_tree("/accounts/a", namespace=NAMESPACE, shared=True, backend=lock_backend) as shared:
        with pytest.raises(InvalidLockArgument, match="shared"):
            fenced_update(Account.objects.using(alias).all(), shared, balance=20)
    assert state(alias) == [("a", 10, 0)]


def test_fenced_save_inserts_then_updates_then_refuses(alias):
    account = Account(name="a", balance=1)
    fenced_save(account, 4, using=alias)
    assert (account.pk is not None, account.fence) == (True, 4)
    account.balance, account.note = 2, "ignored"
    fenced_save(account, 6, update_fields=["balance"])
    assert Account.objects.using(alias).filter(pk=account.pk).values_list("balance", "note", "fence")[0] == (2, "", 6)
    stale = Account.objects.using(alias).get(pk=account.pk)
    stale.balance = 3
    with pytest.raises(StaleFence):
        fenced_save(stale, 5)
    assert state(alias) == [("a", 2, 6)]
    with pytest.raises(InvalidLockArgument, match="is the fence"):
        fenced_save(account, 7, update_fields=["fence"])


def test_fenced_save_of_a_row_inserted_meanwhile_becomes_a_fenced_update(alias):
    (first,) = accounts(alias, "a", fence=6)
    # The same primary key, saved as new (its row already there): the insert loses, the fenced update decides.
    racer = Account(pk=first.pk, name="a", balance=50)
    racer._state.db = alias
    with pytest.raises(StaleFence):
        fenced_save(racer, 5)
    fenced_save(racer, 7)
    assert state(alias) == [("a", 50, 7)]
    # A unique field broken by a new row: an IntegrityError, not a refusal.
    with pytest.raises(IntegrityError):
        fenced_save(Account(name="a"), 8, using=alias)


def test_racing_inserts_of_one_primary_key(alias):
    """Threads insert one pk at once: exactly the newest token's values stay, whoever inserted first."""
    barrier = threading.Barrier(4, timeout=30)
    errors = []

    def save(token):
        try:
            barrier.wait()
            fenced_save(Account(pk=1000, name="raced", balance=token), token, using=alias)
        except StaleFence:
            pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=save, args=(token,)) for token in (11, 12, 13, 14)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert state(alias) == [("raced", 14, 14)]


def test_racing_multi_row_updates_are_all_or_nothing(alias):
    """Threads update the same rows, some of them already at token 6, at once: first with tokens below 6 (every
    one refused whole), then with tokens from 6 up in shuffled order (each written whole or refused whole).

    Every update that goes through adds 1 to every row: rows whose counts
    differ, or a count other than the updates reported written, would be a
    half-written update.
    """
    accounts(alias, *(f"r{i}" for i in range(8)), fence=0)
    Account.objects.using(alias).filter(name__in=["r1", "r4", "r6"]).update(fence=6)
    written, errors = [], []

    def update(token, barrier):
        try:
            barrier.wait()
            for _ in range(3):
                try:
                    fenced_update(Account.objects.using(alias).all(), token, balance=F("balance") + 1)
                    written.append(token)
                except StaleFence:
                    pass
                except OperationalError as e:
                    if alias != "default":  # SQLite may say "database is locked" under this many writers
                        errors.append(e)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            connections.close_all()

    for tokens in ([1, 2, 3, 4, 5], random.sample(range(6, 13), 7)):
        barrier = threading.Barrier(len(tokens), timeout=30)
        threads = [threading.Thread(target=update, args=(token, barrier)) for token in tokens]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors and not any(t.is_alive() for t in threads)
        balances = {b for _, b, _ in state(alias)}
        assert balances == {10 + len(written)}, (balances, written)
    assert written and min(written) >= 6 and {f for _, _, f in state(alias)} == {max(written)}


def test_async_twins(alias):
    accounts(alias, "a", fence=3)

    async def write():
        assert await afenced_update(Account.objects.using(alias).all(), 4, balance=40) == 1
        with pytest.raises(StaleFence):
            await afenced_update(Account.objects.using(alias).all(), 3, balance=30)
        await afenced_save(Account(name="b", balance=5), 4, using=alias)
        await sync_to_async(connections.close_all)()  # the thread sync_to_async ran in

    asyncio.run(write())
    assert state(alias) == [("a", 40, 4), ("b", 5, 4)]


def test_stale_fence_crosses_processes():
    error = pickle.loads(pickle.dumps(StaleFence("refused", token=3, newer=9)))
    assert (str(error), error.token, error.newer) == ("refused", 3, 9)


def test_fence_field_deconstructs_for_migrations():
    _name, path, args, kwargs = FenceField(namespace="orders").deconstruct()
    assert (path, args, kwargs) == ("django_esdlock.fencing.FenceField", [], {"namespace": "orders"})
    assert FenceField().deconstruct()[3] == {}
    assert FenceField(db_index=True).deconstruct()[3] == {"db_index": True}
    assert "import django_esdlock.fencing" in MigrationWriter.serialize(FenceField())[1]
