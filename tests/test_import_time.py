"""benchmarks.import_time: CPython's import report read back, and the chain that reached each module."""
import pytest

from benchmarks import import_time as it

REPORT = """import time: self [us] | cumulative | imported package
import time:        10 |         10 |     c
import time:        20 |         30 |   b
import time:         5 |          5 |   d
import time:       100 |        135 | a
import time:         7 |          7 | e
not a report line
"""


def test_the_report_is_read_with_its_nesting():
    rows = it.parse_importtime(REPORT)
    assert [(r["module"], r["self_us"], r["cumulative_us"], r["depth"]) for r in rows] == \
        [("c", 10, 10, 2), ("b", 20, 30, 1), ("d", 5, 5, 1), ("a", 100, 135, 0), ("e", 7, 7, 0)]
    assert it.chains(rows) == [["a", "b"], ["a"], ["a"], [], []]


def test_slowest_names_the_chain_that_reached_a_module():
    rows = it.parse_importtime(REPORT)
    top = it.slowest(rows, "cumulative_us", 2)
    assert [(r["module"], r["via"]) for r in top] == [("a", ""), ("b", "a")]
    assert it.slowest(rows, "self_us", 1)[0]["module"] == "a"
    with pytest.raises(ValueError, match="key must be"):
        it.slowest(rows, "total")


def test_a_real_statement_is_timed_and_profiled():
    r = it.run_statement("import json", runs=2, importtime=True)
    assert len(r["seconds"]) == 2 and all(s > 0 for s in r["seconds"])
    assert any(row["module"] == "json" and row["depth"] == 0 for row in r["report"])


def test_a_failing_statement_is_named():
    with pytest.raises(RuntimeError, match="import no_such_module_here"):
        it.run_statement("import no_such_module_here", runs=1)
    with pytest.raises(ValueError, match="runs must be"):
        it.run_statement("pass", runs=0)
