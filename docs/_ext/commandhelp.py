"""The ``command-help`` directive: a management command's ``--help``, read from its parser when the docs are built."""

import os

from django.core.management import load_command_class
from docutils import nodes
from sphinx.util.docutils import SphinxDirective


class CommandHelp(SphinxDirective):
    """Render ``manage.py NAME --help`` of one of the app's commands: the page cannot drift from the code."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width; the page's is fixed
        parser = load_command_class("django_esdlock", name).create_parser("manage.py", name)
        text = parser.format_help()
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def setup(app):
    app.add_directive("command-help", CommandHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
