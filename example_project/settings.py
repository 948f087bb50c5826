"""Settings of the example project, read from the environment with django-environ.

With nothing set it runs on the embedded default: SQLite for Django's tables
and for the locks, and the file system in the Elasticsearch at
``ELASTICSEARCH_URL`` (``manage.py demo`` starts a local noida-db when unset).
``LOCK_URL`` (or ``LOCK_BACKEND``) points the locks at Elasticsearch
(``elasticsearch://127.0.0.1:9200/locks``) or PostgreSQL; ``DATABASE_URL``
moves Django's tables.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

try:  # Django's Tasks framework: built in from Django 6, the django-tasks backport before
    import django.tasks  # noqa: F401

    TASKS_APPS = ["django_tasks_db"]
except ImportError:
    TASKS_APPS = ["django_tasks", "django_tasks_db"]

SECRET_KEY = env.str("SECRET_KEY", default="example-project-not-secret")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
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
    *TASKS_APPS,
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
ASGI_APPLICATION = "example_project.asgi.application"
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
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'example.sqlite3'}")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

LOCK_BACKEND = (
    env.str("LOCK_URL", default=None)
    or env.str("LOCK_BACKEND", default=None)
    or {
        "BACKEND": "django_esdlock.backends.database.DatabaseLockBackend",
        "OPTIONS": {"using": "default"},
        "TTL": 30,
    }
)
# Where the file system lives. Empty: `demo` starts a local noida-db; other
# commands and the site then use http://127.0.0.1:9200.
ELASTICSEARCH_URL = env.str("ELASTICSEARCH_URL", default="")
FS_INDEX = env.str("FS_INDEX", default="fs")
FS_LOCK_WAIT = env.float("FS_LOCK_WAIT", default=5.0)  # seconds a rename from the page may wait for its locks

# Renames as background tasks (fs/tasks.py): queued in Django's database, run by `manage.py db_worker`
# (`demo` starts one). FS_TASK_PAUSE slows a task's move down between batches, to watch (or kill) it.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
FS_TASK_PAUSE = env.float("FS_TASK_PAUSE", default=0.0)
FS_TASK_BATCH_SIZE = env.int("FS_TASK_BATCH_SIZE", default=500)
# At most this many rename tasks move documents at once, across every worker (a semaphore; fs/tasks.py).
FS_MAX_RENAMES = env.int("FS_MAX_RENAMES", default=2)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_esdlock": {"handlers": ["console"], "level": env.str("LOCK_LOG_LEVEL", default="INFO")},
        "example_project": {"handlers": ["console"], "level": env.str("LOCK_LOG_LEVEL", default="INFO")},
    },
}
