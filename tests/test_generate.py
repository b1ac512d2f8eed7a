"""generate on a core install (``pip install ggufdspark``, no extras): one line naming what is
missing and how to install it, before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What a core install lacks: every optional dependency in pyproject.toml (extras and test).
OPTIONAL = ["tokenizers", "torch", "transformers", "safetensors", "sentencepiece", "jinja2", "matplotlib", "PIL",
            "llama_cpp"]

# Loaded at interpreter start (PYTHONPATH comes before site-packages): imports of OPTIONAL fail
# exactly as they do where the package is not installed.
CORE_INSTALL = f"""
import sys

BLOCKED = {set(OPTIONAL)!r}


class CoreInstall:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, CoreInstall())
"""


def core_python(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "core-install"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CORE_INSTALL)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def test_generate_on_a_core_install_refuses_in_one_line_and_writes_nothing(tmp_path):
    env = core_python(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import tokenizers"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert probe.returncode != 0 and "No module named 'tokenizers'" in probe.stderr  # the premise holds
    for extra in ([], ["--vl"], ["--only", "drafter"]):
        out = tmp_path / "pair" / "nested"
        p = subprocess.run([sys.executable, "-m", "ggufdspark", "generate", str(out), *extra], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 1, p.stderr
        assert p.stderr == ("ggufdspark: error: generating checkpoints needs the Python package 'tokenizers' "
                            "(No module named 'tokenizers'): pip install 'ggufdspark[generate]'\n"), p.stderr
        assert p.stdout == ""
        assert not (tmp_path / "pair").exists()  # nothing half-made: a retry after installing just works
