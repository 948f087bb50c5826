"""A test-only app: models whose rows the fencing tests write."""

from django.apps import AppConfig


class FencingAppConfig(AppConfig):
    name = "tests.fencing_app"
    label = "fencing_app"
    default_auto_field = "django.db.models.BigAutoField"
