"""tests/conftest.py's first-in-line list names tests that exist: a renamed test would drop out of it
silently and run last, alone, at the end of the run."""
from tests.conftest import FIRST


def test_every_first_in_line_prefix_names_a_collected_test(request):
    collected = [item.nodeid for item in request.session.items]
    files = {nodeid.split("::")[0] for nodeid in collected}
    # A run of a few files collects only theirs: a prefix is held to its file where that file was collected.
    stale = [prefix for prefix in FIRST
             if prefix.split("::")[0] in files and not any(nodeid.startswith(prefix) for nodeid in collected)]
    assert not stale, f"tests/conftest.py FIRST names no collected test: {stale} (renamed? update the list)"
