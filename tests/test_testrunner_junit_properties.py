"""Property-based: the test runner's two count sources -- pytest's junit XML and this package's
own record -- read any bytes (a crashed pytest, a rewritten file, hostile XML) without raising,
and never count more than the file holds."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mbridge_recompute.runs import testrunner

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
XML = [b"<testsuites>", b"</testsuites>", b'<testsuite tests="', b'" failures="', b'" skipped="', b'">',
       b"</testsuite>", b'<testcase classname="a" name="t">', b"</testcase>", b"<skipped/>", b"<failure/>",
       b"<error/>", b"abc", b"-1", b"9" * 5000, b"<!DOCTYPE x [<!ENTITY a 'aaaa'>]>", b"&a;", b"\x00", b"<"]
junit_bytes = st.lists(st.one_of(st.sampled_from(XML), st.binary(max_size=30)), max_size=40).map(b"".join)


@FAST
@given(junit_bytes)
def test_junit_reader_takes_any_bytes(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "junit.xml"
        path.write_bytes(data)
        c = testrunner.read_junit(path)
        assert c.tests >= 0 and c.failures >= 0 and c.skipped >= 0 and c.passed >= 0
        assert testrunner.verdict(c, 0) in ("pass", "fail", "no-tests")


record_lines = st.lists(st.one_of(
    st.tuples(st.text(max_size=10), st.sampled_from(["setup", "call", "teardown", "collect", "x"]),
              st.sampled_from(["passed", "failed", "skipped", "?"])).map(lambda t: json.dumps(list(t))),
    st.text(max_size=30)), max_size=30).map("\n".join)


@FAST
@given(record_lines)
def test_record_reader_takes_any_lines(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "record.jsonl"
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        c = testrunner.read_record(path)
        assert c is not None and c.passed <= c.tests
        assert testrunner.verdict(c, 0) in ("pass", "fail", "no-tests")
