"""The release a Django team installs: the sdist and wheel build and pass ``twine check``, the wheel holds the
package and nothing else, and a new user's path works from the installed wheel alone: ``startproject``, the app
in ``INSTALLED_APPS``, ``LOCK_BACKEND`` from a URL (SQLite, PostgreSQL), ``migrate``, ``check``, a view under
``lock_tree`` that two concurrent requests cannot both enter, and the admin listing the held lock.
"""

from __future__ import annotations

import concurrent.futures
import http.cookiejar
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

import pytest

from .dbstores import postgres_database

pytestmark = pytest.mark.release

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGE_DATA = ("py.typed", ".html", ".sql")
"""What the package ships besides modules (``[tool.setuptools.package-data]``)."""
ADMIN_PASSWORD = "a-new-users-password"


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """Build the sdist and the wheel from a copy of the tracked files (no stray file of the work tree gets in)."""
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("source")
    tracked = run("git", "ls-files", "-z", cwd=ROOT).split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    run(sys.executable, "-m", "build", "--outdir", out, source, cwd=source)
    run(sys.executable, "-m", "twine", "check", "--strict", *sorted(out.iterdir()), cwd=out)
    return out


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("*.whl")
    return wheel


def test_the_wheel_holds_the_package_and_nothing_else(dist):
    names = set(zipfile.ZipFile(wheel_of(dist)).namelist())
    info = f"django_esdlock-{PROJECT['version']}.dist-info"
    shipped = {n for n in names if not n.startswith(info + "/")}
    tracked = run("git", "ls-files", "django_esdlock", cwd=ROOT).split()
    expected = {n for n in tracked if n.endswith(".py") or n.endswith(PACKAGE_DATA)}
    assert shipped == expected, f"missing {sorted(expected - shipped)}; stray {sorted(shipped - expected)}"
    assert not any(re.search(r"(^|/)(tests?|example_project|docs)/", n) for n in shipped)
    assert {f"{info}/licenses/LICENSE", f"{info}/METADATA", f"{info}/RECORD"} <= names
    metadata = zipfile.ZipFile(wheel_of(dist)).read(f"{info}/METADATA").decode()
    assert f"Version: {PROJECT['version']}" in metadata
    assert "License-Expression: MIT" in metadata


def test_one_version(dist):
    import django_esdlock

    assert django_esdlock.__version__ == PROJECT["version"]
    assert {p.name for p in dist.iterdir()} == {
        f"django_esdlock-{PROJECT['version']}.tar.gz",
        f"django_esdlock-{PROJECT['version']}-py3-none-any.whl",
    }


def test_the_classifiers_name_what_tox_tests():
    tox = (ROOT / "tox.ini").read_text()
    envs = set(re.findall(r"py(\d)(\d+)-django(\d)(\d+)", tox))
    pythons = {f"{a}.{b}" for a, b, _, _ in envs}
    djangos = {f"{c}.{d}" for _, _, c, d in envs}
    classifiers = PROJECT["classifiers"]
    assert {c.rsplit(" :: ", 1)[1] for c in classifiers if c.startswith("Programming Language :: Python :: 3.")} == (
        pythons
    )
    assert {c.rsplit(" :: ", 1)[1] for c in classifiers if c.startswith("Framework :: Django :: ")} == djangos
    assert PROJECT["requires-python"] == f">={min(pythons, key=lambda v: tuple(map(int, v.split('.'))))}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh virtualenv with the built wheel and its ``postgres`` extra: never the source tree."""
    where = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", where, cwd=where)
    wheel = wheel_of(dist)
    run(where / "bin" / "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[postgres]", cwd=where)
    return where


@pytest.fixture(scope="module")
def project(venv, tmp_path_factory) -> Path:
    """``django-admin startproject`` with the app added, as the docs' quick start says, and one view."""
    home = tmp_path_factory.mktemp("newsite")
    run(venv / "bin" / "django-admin", "startproject", "newsite", home, cwd=home)
    settings = home / "newsite" / "settings.py"
    text = settings.read_text().replace("INSTALLED_APPS = [", 'INSTALLED_APPS = [\n    "django_esdlock",', 1)
    settings.write_text(text + '\nimport os\n\nLOCK_BACKEND = os.environ["LOCK_URL"]\n')
    shutil.copy(ROOT / "tests" / "newuser" / "views.py", home / "newsite" / "views.py")
    urls = home / "newsite" / "urls.py"
    urls.write_text(
        urls.read_text().replace("from django.urls import path", "from django.urls import path\n\nfrom . import views")
        + '\nurlpatterns.append(path("rename/", views.rename))\n'
    )
    return home


def user_env(venv: Path, lock_url: str) -> dict[str, str]:
    """The environment of the new user's commands: no trace of this suite's paths or settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DJANGO", "VIRTUAL_ENV", "ESDLOCK"))}
    env |= {"PATH": f"{venv / 'bin'}:{env.get('PATH', '')}", "LOCK_URL": lock_url}
    env |= {"DJANGO_SUPERUSER_PASSWORD": ADMIN_PASSWORD, "PYTHONDONTWRITEBYTECODE": "1"}
    return env


class Browser:
    """A user agent with cookies and CSRF, enough for the admin's login form."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str, timeout: float = 30) -> tuple[int, str]:
        try:
            with self.opener.open(self.base + path, timeout=timeout) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def log_in(self, user: str, password: str) -> None:
        self.get("/admin/login/")
        token = next(c.value for c in self.jar if c.name == "csrftoken")
        form = urllib.parse.urlencode({"username": user, "password": password, "csrfmiddlewaretoken": token})
        request = urllib.request.Request(
            self.base + "/admin/login/?next=/admin/", data=form.encode(), headers={"Referer": self.base + "/admin/"}
        )
        with self.opener.open(request, timeout=30) as answer:
            assert "/admin/login/" not in answer.url, "the admin refused the new user's superuser"


def wait_until_up(browser: Browser, server: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        assert server.poll() is None, f"runserver exited:\n{server.communicate()[1]}"
        try:
            browser.get("/admin/login/", timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    pytest.fail("runserver did not answer within 60 s")


@pytest.fixture(params=["sqlite", "postgres"])
def lock_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'locks.sqlite3'}"
    else:
        with postgres_database() as url:
            yield url


def test_a_new_users_project_from_the_wheel(venv, project, lock_url, tmp_path):
    env = user_env(venv, lock_url)
    python = venv / "bin" / "python"
    where = run(python, "-c", "import django_esdlock; print(django_esdlock.__file__)", cwd=tmp_path, env=env)
    assert where.startswith(str(venv)), f"django_esdlock came from {where}, not the installed wheel"
    run(python, "manage.py", "migrate", "--noinput", cwd=project, env=env)
    run(python, "manage.py", "check", cwd=project, env=env)
    run(python, "manage.py", "check", "--deploy", "--fail-level", "ERROR", cwd=project, env=env)
    subprocess.run(  # the same superuser for both stores' runs (Django's tables stay in the project's db.sqlite3)
        [python, "manage.py", "createsuperuser", "--noinput", "--username", "admin", "--email", "a@example.com"],
        cwd=project,
        env=env,
        capture_output=True,
        timeout=120,
    )
    port = free_port()
    server = subprocess.Popen(
        [python, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        browser = Browser(f"http://127.0.0.1:{port}")
        wait_until_up(browser, server, time.monotonic() + 60)
        browser.log_in("admin", ADMIN_PASSWORD)
        path = "/clinton/projects/README.txt"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            holding = pool.submit(Browser(browser.base).get, f"/rename/?path={path}&hold=6")
            deadline = time.monotonic() + 5
            while path not in browser.get("/admin/django_esdlock/heldlock/")[1]:
                assert time.monotonic() < deadline, "the admin never listed the held lock"
                assert not holding.done(), f"the first request ended before the admin saw its lock: {holding.result()}"
                time.sleep(0.2)
            # Two requests at once: the second finds the lock held (and its folder, which X below excludes).
            assert Browser(browser.base).get(f"/rename/?path={path}") == (409, "busy")
            assert Browser(browser.base).get("/rename/?path=/clinton") == (409, "busy")
            status, body = holding.result(timeout=60)
        assert status == 200 and body.startswith("renamed under token"), body
        status, body = Browser(browser.base).get(f"/rename/?path={path}")
        assert status == 200, body
        assert path not in browser.get("/admin/django_esdlock/heldlock/")[1]
    finally:
        server.terminate()
        server.wait(timeout=30)
