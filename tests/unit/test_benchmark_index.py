"""benchmarks/README.md is what benchmarks/index.py generates, and every benchmark folder gives the
index its fields; the benchmarks tree carries no work-session or attempt labels."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _index():
    spec = importlib.util.spec_from_file_location("benchmark_index", BENCH / "index.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_committed_index_is_what_the_generator_writes():
    index = _index()
    assert (BENCH / "README.md").read_text(encoding="utf-8") == index.render(index.entries(BENCH)), \
        "benchmarks/README.md is out of date: run python benchmarks/index.py"


def test_every_benchmark_folder_has_the_fields():
    index = _index()
    folders = sorted(p.name for p in BENCH.iterdir() if p.is_dir() and p.name not in index.SKIP)
    items = index.entries(BENCH)
    assert [e.name for e in items] == folders
    for e in items:
        assert e.question and e.command and e.result, e.name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", e.date), e.name


GOOD = "# T\n\n- Question: q?\n- Command: `c`\n- Result: r\n- Date: 2026-11-24\n\nbody\n"


def test_parse_reads_the_header():
    e = _index().parse("x", GOOD)
    assert (e.title, e.question, e.command, e.result, e.date) == ("T", "q?", "`c`", "r", "2026-11-24")


@pytest.mark.parametrize("text, what", [
    ("", "title"),
    ("no title\n- Question: q\n", "title"),
    (GOOD.replace("- Result: r\n", ""), "Result"),
    (GOOD.replace("- Command: `c`\n- Result: r\n", "- Result: r\n- Command: `c`\n"), "Command"),
    (GOOD.replace("- Result: r", "- Result: "), "Result"),
    (GOOD.replace("2026-11-24", "24 Nov 2026"), "YYYY-MM-DD"),
])
def test_parse_names_what_is_wrong(text, what):
    index = _index()
    with pytest.raises(index.IndexError_, match=what):
        index.parse("x", text)


def test_a_folder_without_readme_is_an_error(tmp_path):
    index = _index()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "README.md").write_text(GOOD)
    (tmp_path / "b").mkdir()
    with pytest.raises(index.IndexError_, match="b/ has no README"):
        index.entries(tmp_path)


def test_no_session_or_attempt_labels_under_benchmarks():
    labels = r"_s[0-9]+\b|[Ss]ession [0-9]|[Aa]ttempt [0-9]"
    out = subprocess.run(["git", "grep", "-nIE", labels, "--", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 128:
        pytest.skip("not a git checkout")
    assert out.stdout == "", out.stdout[:2000]
