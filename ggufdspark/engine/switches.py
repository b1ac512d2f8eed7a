"""The environment variables the engine patch series reads, taken from the patches themselves.

docs/engine-patches.md's switch tables are checked against this (``tests/test_switch_table.py``),
so a switch added to or dropped from a patch cannot go unlisted. A name counts as read by a series
when the diffs of its patches add more reads of it than they remove, a read being
``getenv("NAME")`` / ``std::getenv("NAME")`` or a call ``helper("NAME")`` of a function the series
defines around ``getenv(param)`` (0051's ``top_k_env``). ``python -m ggufdspark.engine.switches``
prints the names with the patches that read them; ``--check`` compares them with the docs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ggufdspark.engine.source import dev_patches_dir, patch_files

DOC = Path(__file__).resolve().parents[2] / "docs" / "engine-patches.md"
PRODUCT_HEADING = "## Switches"  # the product series' table follows this heading in DOC
DEV_HEADING = "### Developer build only"  # the developer series' own names: the table after this one

_LITERAL_READ = re.compile(r'\b(?:std::)?getenv\(\s*"([A-Za-z_][A-Za-z0-9_]*)"\s*\)')
_VARIABLE_READ = re.compile(r'\b(?:std::)?getenv\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)')
_TABLE_NAME = re.compile(r"`([A-Z][A-Z0-9_]*[A-Z0-9])(?:=[^`]*)?`")


@dataclass(frozen=True)
class Switch:
    name: str
    patches: tuple[str, ...]  # the four-digit numbers of the patches whose diffs add a read of it


def _diff_lines(text: str) -> list[str]:
    """The lines of a patch's diffs (the commit message, whose bullets may start with '-', left out)."""
    start = re.search(r"^diff --git ", text, re.M)
    return text[start.start():].splitlines() if start else []


def _helpers(added: list[str], where: str) -> set[str]:
    """Functions the added lines define around ``getenv(param)``: their calls with a literal read too."""
    names = set()
    for i, line in enumerate(added):
        m = _VARIABLE_READ.search(line)
        if not m:
            continue
        param = m[1]
        signature = re.compile(rf"\b([A-Za-z_]\w*)\s*\([^()]*\bconst\s+char\s*\*\s*{param}\s*[,)]")
        for before in reversed(added[max(0, i - 5):i]):
            if s := signature.search(before):
                names.add(s[1])
                break
        else:
            raise ValueError(f"{where}: getenv({param}) reads a name this module cannot resolve "
                             f"(expected getenv(\"NAME\") or a helper taking 'const char * {param}'): {line.strip()}")
    return names


def _reads(lines: list[str], readers: set[str]) -> list[str]:
    names = [m[1] for line in lines for m in _LITERAL_READ.finditer(line)]
    for helper in readers:
        call = re.compile(rf'\b{re.escape(helper)}\(\s*"([A-Za-z_][A-Za-z0-9_]*)"\s*\)')
        names += [m[1] for line in lines for m in call.finditer(line)]
    return names


def read_switches(patches: list[Path]) -> dict[str, Switch]:
    """The names ``patches`` (applied in this order) read from the environment.

    Args:
        patches: patch files in ``git format-patch`` form, named ``NNNN-subject.patch``.
    Returns:
        name -> Switch, sorted by name, for every name whose reads the diffs add outnumber the ones
        they remove (a read the pinned tree already makes and no patch adds is not the series').
    Raises:
        ValueError: a ``getenv`` of a variable that is no helper's ``const char *`` parameter.
    """
    net: dict[str, int] = defaultdict(int)
    adders: dict[str, list[str]] = defaultdict(list)
    parsed = []
    readers: set[str] = set()
    for p in patches:
        lines = _diff_lines(p.read_text())
        added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
        removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
        readers |= _helpers(added, p.name)
        parsed.append((p.name[:4], added, removed))
    for number, added, removed in parsed:
        for name in _reads(added, readers):
            net[name] += 1
            if number not in adders[name]:
                adders[name].append(number)
        for name in _reads(removed, readers):
            net[name] -= 1
    return {n: Switch(n, tuple(adders[n])) for n in sorted(net) if net[n] > 0}


def product_switches() -> dict[str, Switch]:
    """What a user's engine reads: the product series (``ggufdspark/data/patches``)."""
    return read_switches(patch_files())


def dev_switches() -> dict[str, Switch]:
    """What ``build-engine --dev`` adds: names the developer series reads that the product series does not."""
    product = product_switches()
    both = read_switches(patch_files(dev=True))
    dev_only = {p.name[:4] for p in sorted(dev_patches_dir().glob("*.patch"))}
    return {n: Switch(n, tuple(x for x in s.patches if x in dev_only))
            for n, s in both.items() if n not in product}


def table_switches(doc: str, heading: str) -> dict[str, tuple[str, ...]]:
    """The names a switch table in ``doc`` lists, with the patch numbers of its 'read by' column.

    The table is the first one after the line ``heading``; its first column holds the names in
    backticks (``NAME=value``), its second the four-digit numbers of the patches that read them.
    """
    lines = doc.splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        raise ValueError(f"{DOC.name}: no line {heading!r}") from None
    rows, seen_table = {}, False
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            if seen_table or line.startswith("#"):
                break
            continue
        seen_table = True
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set(cells[0]) <= set("-: ") or cells[0] == "variable":
            continue
        numbers = tuple(re.findall(r"\b\d{4}\b", cells[1])) if len(cells) > 1 else ()
        for name in _TABLE_NAME.findall(cells[0]):
            rows[name] = numbers
    return rows


def compare(found: dict[str, Switch], listed: dict[str, tuple[str, ...]]) -> list[str]:
    """One line per disagreement between the patches' names and a table's (empty: they agree)."""
    out = [f"{n}: read by patch {', '.join(found[n].patches)}, not in the table" for n in found if n not in listed]
    out += [f"{n}: in the table, read by no patch of the series" for n in listed if n not in found]
    out += [f"{n}: the table says patches {', '.join(listed[n]) or 'none'}, the series reads it in "
            f"{', '.join(found[n].patches)}" for n in found if n in listed and listed[n] != found[n].patches]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ggufdspark.engine.switches", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help=f"compare with the tables of {DOC}")
    args = ap.parse_args(argv)
    series = {"product": (product_switches(), PRODUCT_HEADING), "dev": (dev_switches(), DEV_HEADING)}
    if not args.check:
        for label, (found, _) in series.items():
            for s in found.values():
                print(f"{label}\t{s.name}\t{','.join(s.patches)}")
        return 0
    doc = DOC.read_text()
    problems = [f"{label}: {line}" for label, (found, heading) in series.items()
                for line in compare(found, table_switches(doc, heading))]
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
