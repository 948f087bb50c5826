"""URLs of the example project: the file system pages and the admin."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("example_project.fs.urls")),
]
