"""App configuration: registers the system checks and the log redaction."""

from django.apps import AppConfig


class EsdlockConfig(AppConfig):
    name = "django_esdlock"
    verbose_name = "Locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)
        from .recovery import autodiscover
        from .redaction import install_log_filter

        install_log_filter()  # after Django configured logging: no secret in the library's log records
        autodiscover()
