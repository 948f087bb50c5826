from django.apps import AppConfig


class FsConfig(AppConfig):
    name = "example_project.fs"
    label = "fs"
    verbose_name = "File system (the chapter's example)"
