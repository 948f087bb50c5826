"""Users with exactly the admin permissions a test needs."""

from __future__ import annotations

from django.contrib.auth.models import Permission


def staff_user(django_user_model, username: str, *codenames: str):
    user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_esdlock", codename__in=codenames)
    )
    return user
