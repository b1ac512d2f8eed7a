"""docs/engine-patches.md's switch tables list exactly the environment variables the patch series
read (ggufdspark.engine.switches reads them from the patches); no engine is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggufdspark.engine import switches

DOC = switches.DOC.read_text()
# switches that chose a path neither the default nor the pinned one, or turned off half of a change
# folded into one patch; product-44 removed them
VARIANTS_REMOVED = ("GGML_CUDA_TOPK_ONE_BLOCK", "LLAMA_SPEC_FIRST_TOKEN_EARLY", "LLAMA_SPEC_INJECT_EARLY",
                    "LLAMA_SPEC_INJECT_EVENTS", "LLAMA_SERVER_IDLE_PUBLISH_SYNC", "LLAMA_SPEC_CUT_GENERATING")


def test_the_switch_table_lists_exactly_what_the_product_series_reads():
    found = switches.product_switches()
    listed = switches.table_switches(DOC, switches.PRODUCT_HEADING)
    assert switches.compare(found, listed) == []
    # three the table once missed are read and listed
    for name in ("LLAMA_SPEC_IDS_HOST", "LLAMA_SPEC_INJECT_SYNC", "LLAMA_SPEC_FIRST_TOKEN_LATE"):
        assert name in found and name in listed, name
    # the product series reads no switch that picks a variant: each turns its patch off or is one of
    # the three settings (and ggml's own GGML_CUDA_DISABLE_GRAPHS)
    for name in VARIANTS_REMOVED:
        assert name not in found and name not in listed, name


def test_the_developer_table_lists_exactly_what_only_the_developer_series_reads():
    found = switches.dev_switches()
    listed = switches.table_switches(DOC, switches.DEV_HEADING)
    assert switches.compare(found, listed) == []
    assert not set(found) & set(switches.product_switches())


def test_a_row_missing_or_extra_or_misattributed_is_reported():
    """The check above can fail: the real table with one row dropped, one invented and one patch
    number changed disagrees with the series in those three names and no other."""
    lines = DOC.splitlines()
    drop = next(i for i, line in enumerate(lines) if line.startswith("| `LLAMA_SPEC_IDS_HOST=1` | 0061 |"))
    lines[drop:drop + 1] = ["| `LLAMA_SPEC_NO_SUCH_SWITCH=1` | 0061 | off | off | invented |"]
    moved = next(i for i, line in enumerate(lines) if line.startswith("| `LLAMA_GRAPH_SCHEDS=1` | 0064 |"))
    lines[moved] = lines[moved].replace("| 0064 |", "| 0063 |", 1)
    listed = switches.table_switches("\n".join(lines), switches.PRODUCT_HEADING)
    problems = switches.compare(switches.product_switches(), listed)
    assert len(problems) == 3, problems
    assert [p.split(":")[0] for p in problems] == ["LLAMA_SPEC_IDS_HOST", "LLAMA_SPEC_NO_SUCH_SWITCH",
                                                   "LLAMA_GRAPH_SCHEDS"], problems


def _patch(tmp_path: Path, name: str, message: str, diff: str) -> Path:
    p = tmp_path / name
    p.write_text(f"From: x\nSubject: [PATCH] s\n\n{message}\n---\n a.c | 1 +\n\ndiff --git a/a.c b/a.c\n"
                 f"--- a/a.c\n+++ b/a.c\n@@ -1 +1 @@\n{diff}\n")
    return p


def test_reads_forms_helpers_and_removals(tmp_path):
    first = _patch(tmp_path, "0001-a.patch",
                   '- a bullet of the message that says getenv("IN_THE_MESSAGE")',
                   '+    const char * a = getenv("PLAIN");\n'
                   '+    const char * b = std::getenv( "STD" );\n'
                   '+static bool flag_env(const char * name) {\n'
                   '+    const char * env = getenv(name);\n'
                   '+    return env != nullptr;\n'
                   '+}\n'
                   '+    static const bool c = flag_env("BY_HELPER");\n'
                   '+    const char * d = getenv("GONE_LATER");\n'
                   '     const char * e = getenv("PINNED_CONTEXT");')
    second = _patch(tmp_path, "0002-b.patch", "m",
                    '-    const char * d = getenv("GONE_LATER");\n'
                    '+    const char * a2 = getenv("PLAIN");\n'
                    '-    const char * u = getenv("UPSTREAM_ONLY");')
    found = switches.read_switches([first, second])
    assert {n: s.patches for n, s in found.items()} == {
        "BY_HELPER": ("0001",), "PLAIN": ("0001", "0002"), "STD": ("0001",)}


def test_a_read_through_an_unknown_variable_is_refused(tmp_path):
    p = _patch(tmp_path, "0003-c.patch", "m", "+    const char * env = getenv(some_name);")
    with pytest.raises(ValueError, match=r"0003-c.patch: getenv\(some_name\)"):
        switches.read_switches([p])


def test_main_check_agrees_with_the_docs(capsys):
    assert switches.main(["--check"]) == 0
    assert capsys.readouterr().out == ""
