"""Set-up and the two quick-start commands, with nothing but Python 3.10+ installed.

    python3 tools/dev.py train   # make .venv, install the pinned dependencies, train the default model
    python3 tools/dev.py test    # make .venv, install the pinned dependencies, run the whole test suite

The virtualenv lives in ``.venv`` at the repo root and is reinstalled only when requirements.lock
changes. Extra arguments go to the trainer after the defaults (``train``: ``--model`` and ``--logdir``
given again replace them, ``--params_override=...`` adds to them) or to pytest (``test``). Ctrl-C
stops the command with its own one line. Standard library only: this runs before any dependency
exists.

``test`` runs pytest on TEST_WORKERS processes (pytest-xdist's ``-n``): most tests wait on the trainer
subprocesses they start, so more workers than cores keep the cores busy. ``--dist loadscope``, as
tests/conftest.py schedules it, hands tests out one by one (the long ones, such as each document's
commands, spread over the workers), except that a test file defining a module-scoped fixture goes to
one worker whole, so the fixture is made once. Give ``-n N`` (``-n 0``:
one process, no workers), ``--numprocesses``, ``--dist`` or ``-p no:xdist`` yourself to choose otherwise.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
LOCK = ROOT / "requirements.lock"
STAMP = VENV / ".requirements.sha256"
DEFAULT_TRAIN_ARGS = ["--model=image.digits.ConvNet", "--logdir=runs/digits"]
TEST_WORKERS = 3


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv() -> Path:
    """Creates .venv and installs requirements.lock when missing or changed; returns its python."""
    if sys.version_info < (3, 10):  # noqa: UP036 (this script must run to say so)
        sys.exit(f"dev: error: Python 3.10 or newer is needed, this is {sys.version.split()[0]}")
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    python = venv_python()
    if python.exists() and STAMP.exists() and STAMP.read_text().strip() == digest:
        return python
    if not python.exists():
        print(f"dev: creating virtualenv {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    print("dev: installing pinned dependencies from requirements.lock (about a minute)", flush=True)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    # --no-deps: the lock pins the whole tree, and tensorflow-text would otherwise pull `tensorflow`
    # beside tensorflow_cpu (two TensorFlows in one site-packages).
    subprocess.run([*pip, "install", "--no-deps", "-r", str(LOCK)], check=True)
    STAMP.write_text(digest + "\n")
    return python


def main(argv: list[str]) -> int:
    commands = {"setup", "train", "test"}
    if len(argv) < 2 or argv[1] not in commands:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    command, extra = argv[1], argv[2:]
    try:
        python = ensure_venv()
    except subprocess.CalledProcessError as e:
        print(f"dev: error: installing dependencies failed ({e})", file=sys.stderr)
        return 1
    if command == "setup":
        return 0
    if command == "train":
        args = [str(python), "-m", "trainer", *DEFAULT_TRAIN_ARGS, *extra]  # absl: a later flag wins
    else:
        args = [str(python), "-m", "pytest", *xdist_args(extra), *extra]
    return run_quietly(args)


def xdist_args(extra: list[str]) -> list[str]:
    """``-n TEST_WORKERS --dist loadscope`` unless the user's pytest arguments choose the workers."""
    chosen = ("-n", "--numprocesses", "--dist", "-pno:xdist")
    for before, arg in zip(["", *extra], extra):
        if arg.startswith(chosen) or (before == "-p" and arg == "no:xdist"):
            return []
    return ["-n", str(TEST_WORKERS), "--dist", "loadscope"]


def run_quietly(args: list[str]) -> int:
    """Runs a command; on Ctrl-C (which the command gets too) waits for its own clean exit."""
    proc = subprocess.Popen(args, cwd=ROOT)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue  # a second Ctrl-C too: the command decides when it has stopped


if __name__ == "__main__":
    sys.exit(main(sys.argv))
