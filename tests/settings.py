"""Django settings for the test suite; each test picks its lock backend itself."""

import os

import environ

from .throwaway_postgres import test_database_url

try:
    import django.tasks  # noqa: F401  (Django 6)

    TASKS_APPS = ["django_tasks_db"]
except ImportError:
    TASKS_APPS = ["django_tasks", "django_tasks_db"]

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_esdlock",
    "example_project.fs",
    "tests.fencing_app",  # rows the fencing tests write
    *TASKS_APPS,  # the example's renames as tasks
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
_TEST_SQLITE = os.environ.get("ESDLOCK_TEST_SQLITE", "test-default.sqlite3")
# pytest-django names a parallel run's test database TEST NAME + "_<tox env>" + "_<xdist worker>"; NAME says the
# same, so the processes a test starts (which read NAME, not TEST) open the database of their own test process.
_TEST_SQLITE_HERE = "_".join(
    [_TEST_SQLITE, *filter(None, (os.environ.get("TOX_PARALLEL_ENV"), os.environ.get("PYTEST_XDIST_WORKER")))]
)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _TEST_SQLITE_HERE,
        "TEST": {"NAME": _TEST_SQLITE},
    },
    # DATABASE_URL, else 127.0.0.1:5432, else a throwaway server started here, before any connection is made.
    "postgres": environ.Env.db_url_config(test_database_url()),
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_esdlock": {"handlers": ["console"], "level": "WARNING"}},
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
