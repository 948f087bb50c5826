"""tox's inline plugin (tox 4 loads toxfile.py): find the Pythons pyenv installed, even where its shims fail.

pyenv's shim for ``python3.12`` fails unless 3.12 is a selected pyenv version, and
virtualenv's discovery then finds no 3.12 at all; each installed version's own
``bin`` folder, appended to ``PATH``, has the interpreter itself.
"""

import glob
import os

_versions = os.path.join(os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv"), "versions", "*", "bin")
os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), *sorted(glob.glob(_versions))])
