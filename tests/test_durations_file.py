"""tests/durations.json orders a fresh clone's parallel run (tests/conftest.py): it loads, it names
test files that exist, and a missing or malformed file leaves the collection order alone."""

import json
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_durations_load_and_name_existing_test_files():
    durations = conftest._committed_durations()
    assert durations, "tests/durations.json is missing or malformed: run ./run test --write-durations"
    for nodeid, seconds in durations.items():
        assert (ROOT / nodeid.split("::", 1)[0]).is_file(), nodeid
        assert seconds >= conftest.DURATIONS_MIN_S, (nodeid, seconds)


def test_a_missing_or_malformed_file_gives_no_durations(tmp_path, monkeypatch):
    for text in (None, "{", "[1, 2]", json.dumps({"about": "no durations key"})):
        f = tmp_path / "durations.json"
        if text is not None:
            f.write_text(text)
        monkeypatch.setattr(conftest, "DURATIONS_FILE", f)
        assert conftest._committed_durations() == {}, text
    f.write_text(json.dumps({"durations": {"tests/x.py::t": 2.5}}))
    assert conftest._committed_durations() == {"tests/x.py::t": 2.5}
