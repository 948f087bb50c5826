"""The file system app: the chapter's example, its files and directories as Elasticsearch documents."""

from django.apps import AppConfig


class FsConfig(AppConfig):
    name = "example_project.fs"
    label = "fs"
    verbose_name = "File system (the chapter's example)"
