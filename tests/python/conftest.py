import os
import sys

# The tests' helper scripts and models (tests/python/helpers) are imported by name.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))

import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_garbage_of_earlier_tests():
    """Each test starts with no garbage of the tests before it. The budget allocator counts every
    live tensor it allocated, process-wide, so a cycle left by an earlier test (an exception's
    traceback holding a 4-byte scalar) that Python's collector frees in the middle of a later
    test's trials moves that test's phase peaks by its bytes: under torch 2.15 in CI,
    test_a_shortened_trial_sees_every_phase_peak_of_the_full_trial saw its first full trial peak
    4 bytes above the same trial repeated. The modules imported by then (torch's among them) are
    frozen out of the collections (gc.freeze), so that each costs milliseconds, not the 0.15 s a
    test that scanning them took (38 s over the suite)."""
    if not _frozen:
        gc.freeze()
        _frozen.append(True)
    gc.collect()


_frozen = []


def pytest_sessionfinish(session, exitstatus):
    """The frozen modules back to the collector before the interpreter ends (nanobind's leak
    report named triton's objects that gc.freeze had kept from it)."""
    gc.unfreeze()
    gc.collect()
