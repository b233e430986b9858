"""Set up a virtual environment with everything Tempo needs, then run a job in it.

    python scripts/dev.py train   # the main job: RL training on CartPole (scripts/train.py)
    python scripts/dev.py demo    # compile and run a small RT program, printing each stage
    python scripts/dev.py test    # the test suite (what CI runs)

Extra arguments go to the job (``python scripts/dev.py train algorithm=reinforce``).

Only a Python interpreter is required; the first call creates ``.venv`` and installs the
package with its ``dev`` extra (later calls reuse it while pyproject.toml is unchanged).
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
JOBS = {
    "train": ["scripts/train.py"],
    "demo": ["scripts/demo.py"],
    "test": ["-m", "pytest", "tests"],
}


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_environment() -> Path:
    """Create the venv and install the project when missing or out of date."""
    stamp = VENV / ".tempo-installed"
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted and venv_python().exists():
        return venv_python()
    if not venv_python().exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    python = str(venv_python())
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[dev]"], check=True)
    stamp.write_text(wanted)
    return venv_python()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in JOBS:
        print(f"usage: python scripts/dev.py {{{'|'.join(JOBS)}}} [extra args]", file=sys.stderr)
        return 2
    python = ensure_environment()
    job, extra = argv[0], argv[1:]
    return subprocess.run([str(python), *JOBS[job], *extra], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
