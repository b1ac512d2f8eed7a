"""generate on a core install (``pip install ggufdspark``, no extras): one line naming what is
missing and how to install it, before anything is written."""

from __future__ import annotations

import json
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


def test_generate_json_lists_what_it_wrote(ggufdspark_cli, tmp_path):
    """--json (issue 14): the family, the directories and every file written, with sizes as on disk."""
    out = tmp_path / "pair"
    p = ggufdspark_cli("generate", str(out), "--family", "1.2b", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["family"] == "1.2b" and r["model"] == "LiquidAI/LFM2.5-1.2B-Instruct" and r["size"] == "small"
    assert r["dtype"] == "BF16" and r["vl"] is False and r["moe"] is False
    assert r["out"] == str(out) and r["target"] == str(out / "target") and r["drafter"] == str(out / "drafter")
    on_disk = {str(f): f.stat().st_size for f in out.rglob("*") if f.is_file()}
    assert {f["path"]: f["bytes"] for f in r["files"]} == on_disk and r["bytes"] == sum(on_disk.values())
    for d in ("target", "drafter"):
        assert {str(out / d / n) for n in ("config.json", "model.safetensors")} <= set(on_disk)
    # only a new drafter: the target already there is not reported as written
    again = ggufdspark_cli("generate", str(out), "--family", "1.2b", "--only", "drafter", "--force", "--json")
    assert again.returncode == 0, again.stderr
    r = json.loads(again.stdout)
    assert r["target"] is None and r["drafter"] == str(out / "drafter")
    assert r["files"] and all(f["path"].startswith(str(out / "drafter")) for f in r["files"])
