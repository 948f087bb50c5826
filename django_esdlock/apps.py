"""App configuration: registers the system checks."""

from django.apps import AppConfig


class EsdlockConfig(AppConfig):
    name = "django_esdlock"
    verbose_name = "Locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)
        from .recovery import autodiscover

        autodiscover()
