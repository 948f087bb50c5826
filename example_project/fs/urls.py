"""URLs of the file system pages."""

from django.urls import path

from . import views

app_name = "fs"
urlpatterns = [
    path("", views.browse, name="root"),
    path("browse/<path:path>", views.browse, name="browse"),
    path("search/", views.search, name="search"),
    path("rename/", views.rename_view, name="rename"),
    path("arename/", views.arename_view, name="arename"),
    path("rename-task/", views.rename_task_view, name="rename_task"),
    path("tasks/<str:result_id>/", views.task_view, name="task"),
]
