"""Directives that pull text out of the code while the site builds, so that nothing is written
twice:

``{docstring} minitfm.layers.linear``
    the module's docstring, verbatim, as the reader of the source file sees it (plain-text
    formulas in a monospaced block);
``{command-help} python -m minitfm.translate``
    the ``--help`` of a command line, printed by its own argument parser.
"""

import importlib
import inspect
import os
import shlex
import subprocess
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.errors import ExtensionError

ROOT = Path(__file__).resolve().parents[2]


class Docstring(Directive):
    required_arguments = 1

    def run(self):
        name = self.arguments[0]
        module = importlib.import_module(name)
        env = self.state.document.settings.env
        env.note_dependency(inspect.getsourcefile(module))
        text = inspect.getdoc(module)
        if not text:
            raise self.error(f"{name} has no docstring")
        block = nodes.literal_block(text, text, language="text", classes=["docstring"])
        return [block]


class CommandHelp(Directive):
    """The command's own ``--help``, run from the repository root with a fixed width."""

    required_arguments = 1
    final_argument_whitespace = True

    def run(self):
        words = shlex.split(self.arguments[0])
        if words[0] != "python":
            raise self.error("a command starts with python")
        argv = [sys.executable, *words[1:], "--help"]
        env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise ExtensionError(f"{self.arguments[0]} --help exited {done.returncode}:\n"
                                 f"{done.stderr}")
        script = words[1] if words[1] != "-m" else words[2].replace(".", "/") + ".py"
        source = ROOT / script
        if not source.exists():
            source = ROOT / words[2].replace(".", "/") / "__main__.py"
        if source.exists():
            self.state.document.settings.env.note_dependency(str(source))
        text = done.stdout.rstrip()
        return [nodes.literal_block(text, text, language="text", classes=["command-help"])]


def setup(app):
    app.add_directive("docstring", Docstring)
    app.add_directive("command-help", CommandHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
