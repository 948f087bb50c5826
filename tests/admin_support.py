"""What the admin tests share: users with exactly the permissions a test needs, on every backend."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission


def staff_user(django_user_model, username: str, *codenames: str):
    user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_esdlock", codename__in=codenames)
    )
    return user


@pytest.fixture
def lock_config(store_config, settings):
    """Every admin test runs on each backend: the page must work the same for all."""
    settings.LOCK_BACKEND = store_config
    return store_config


@pytest.fixture
def releaser(client, django_user_model):
    """A client logged in as staff that may view and force-release locks."""
    client.force_login(staff_user(django_user_model, "releaser", "view_heldlock", "delete_heldlock"))
    return client
