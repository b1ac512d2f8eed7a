"""The command line as a whole (issue 14): every option explains itself, and a pair is named the
same way in every verb that takes one."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import click

from ggufdspark.cli import COMMANDS, cli


def _commands() -> dict[str, click.Command]:
    return {name: importlib.import_module(module).command for name, (module, _) in COMMANDS.items()}


def test_every_option_of_every_command_has_help():
    missing = [f"ggufdspark {'/'.join(p.opts)}" for p in cli.params if isinstance(p, click.Option) and not p.help]
    for name, command in _commands().items():
        missing += [f"ggufdspark {name} {'/'.join(p.opts)}" for p in command.params
                    if isinstance(p, click.Option) and not p.help]
    assert not missing, "options without a help text: " + ", ".join(missing)


def test_every_option_of_the_benchmarks_and_scripts_has_help():
    """The argparse parsers of benchmarks/ and scripts/, read from their source (importing them would
    run their path set-up): each add_argument call for an option carries help=."""
    repo = Path(__file__).resolve().parent.parent
    files = sorted([*(repo / "benchmarks").rglob("*.py"), *(repo / "scripts").glob("*.py")])
    assert files, f"no benchmarks or scripts under {repo}"
    missing = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any(k.arg == "help" for k in node.keywords):
                continue
            missing.append(f"{f.relative_to(repo)}:{node.lineno} {'/'.join(names)}")
    assert not missing, "arguments without a help text: " + ", ".join(missing)


def test_check_names_the_pair_like_serve(ggufdspark_cli, small_pair):
    t, d = str(small_pair.target), str(small_pair.draft)
    ways = {"positional": (t, d), "short": ("-m", t, "-md", d), "long": ("--target", t, "--draft", d),
            "model": ("--model", t, d), "draft option": ("-md", d, t)}
    reports = {}
    for way, args in ways.items():
        p = ggufdspark_cli("check", *args, "--json")
        assert p.returncode == 0, (way, p.stderr)
        reports[way] = json.loads(p.stdout)
    assert all(r == reports["positional"] for r in reports.values()), reports
    h = ggufdspark_cli("check", "--help")
    names = re.findall(r"^\s+(-[^\n]*?)\s+(?:FILE|TEXT)", h.stdout, re.MULTILINE)
    assert "-m, -hf, --model, --target, --hf-repo" in names and "-md, -hfd, --draft, --hf-repo-draft" in names, names


def test_check_refuses_a_pair_named_twice_or_not_at_all(ggufdspark_cli, small_pair):
    t, d = str(small_pair.target), str(small_pair.draft)
    p = ggufdspark_cli("check", "-m", t, "-md", d, t)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"unexpected file(s) {t}" in p.stderr, p.stderr
    p = ggufdspark_cli("check", "-md", d)
    assert p.returncode == 2 and "give a TARGET" in p.stderr, p.stderr
    p = ggufdspark_cli("check", "-m", t)
    assert p.returncode == 2 and "give a DRAFT, --mmproj, or both" in p.stderr, p.stderr
