"""Runs a script of scripts/ again under the project's Python when the Python that started it
lacks a package the script imports, so that `scripts/X.py`, `python3 scripts/X.py` and
`"$TRAINER_VENV/bin/python" scripts/X.py` all work. The project's Python is the virtualenv of
scripts/bootstrap.sh (`--dev` installs the scripts' packages there), wherever scripts/env.sh puts
it. The standard library only: this runs under any Python 3.

Use, before the first import outside the standard library:

    try:
        import numpy as np
    except ModuleNotFoundError as e:  # e.g. the system python3: run again under the project's
        import project_python
        project_python.reexec(__file__, e.name)

tests/docs/consistency.py holds the docs to this: a script whose imports leave the standard
library either calls reexec() or is shown run with "$TRAINER_VENV/bin/python"."""
import os
import subprocess
import sys

# Set in the re-executed process: a virtualenv without the package must not loop.
_MARK = "TRAINER_PYTHON_REEXEC"


def project_python():
    """The project's Python: $TRAINER_VENV/bin/python as scripts/env.sh sets it."""
    env_sh = os.path.join(os.path.dirname(os.path.abspath(__file__)), "env.sh")
    venv = subprocess.run(["bash", "-c", 'source "$0" && printf %s "$TRAINER_VENV"', env_sh],
                          capture_output=True, text=True).stdout
    return os.path.join(venv, "bin", "python")


def reexec(script, missing):
    """Replaces this process with `script` under the project's Python, with the same arguments;
    where that is impossible (no virtualenv, or it lacks `missing` too), exits naming the fix."""
    python = project_python()
    if os.path.exists(python) and not os.environ.get(_MARK):
        os.environ[_MARK] = "1"
        os.execv(python, [python, os.path.abspath(script), *sys.argv[1:]])
    sys.exit(f"{os.path.basename(script)}: {sys.executable} has no {missing}, nor has the "
             f"project's Python ({python}): run scripts/bootstrap.sh --dev, which installs it "
             "there")
