"""The skip policy of conftest.py: a skip for a reason outside ALLOWED_SKIPS, an xfail or an
xpass fails the session and is named in the summary; allowed skips do not. Runs pytest, in a
subprocess, on small test files that use this directory's conftest.py as theirs."""
import os

import pytest

from conftest import ALLOWED_SKIPS

CONFTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
NO_GPU, NEEDS_A_GPU = "no CUDA GPU on this machine", "needs a GPU"

ALLOWED = f"""
import pytest

def test_passes():
    pass

def test_no_gpu():
    pytest.skip("{NO_GPU}")

@pytest.mark.skipif(True, reason="{NEEDS_A_GPU}")
def test_needs_a_gpu():
    pass

@pytest.fixture
def device():
    pytest.skip("{NO_GPU}")

def test_in_fixture(device):
    pass
"""

NOT_ALLOWED = """
import pytest

def test_passes():
    pass

def test_skip_call():
    pytest.skip("the toolkit is missing")

@pytest.fixture(scope="module")
def built():
    pytest.skip("could not build it")

def test_skip_in_fixture(built):
    pass

@pytest.mark.skipif(True, reason="not on this platform")
def test_skipif_marker():
    pass

@pytest.mark.skip
def test_skip_marker():
    pass

def test_importorskip():
    pytest.importorskip("a_module_that_does_not_exist")

@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False

@pytest.mark.xfail(reason="fixed bug")
def test_xpass():
    pass
"""

SKIPPED_MODULE = """
import pytest

pytest.skip("the whole module", allow_module_level=True)

def test_never_collected():
    pass
"""


@pytest.fixture
def suite(pytester):
    with open(CONFTEST) as f:
        pytester.makeconftest(f.read())
    return pytester


def run(pytester):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", timeout=300)


def test_the_policy_allows_exactly_the_no_gpu_skips():
    assert ALLOWED_SKIPS == {NO_GPU, NEEDS_A_GPU}


def test_allowed_skips_pass(suite):
    suite.makepyfile(test_allowed=ALLOWED)
    result = run(suite)
    result.assert_outcomes(passed=1, skipped=3)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.no_fnmatch_line("*not in ALLOWED_SKIPS*")


def test_other_skips_xfails_and_xpasses_fail_the_run_and_are_named(suite):
    suite.makepyfile(test_allowed=ALLOWED, test_not_allowed=NOT_ALLOWED,
                     test_skipped_module=SKIPPED_MODULE)
    result = run(suite)
    result.assert_outcomes(passed=2, skipped=3 + 5 + 1, xfailed=1, xpassed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*= skipped for a reason not in ALLOWED_SKIPS: the run fails =*",
        "1 test(s): the whole module",  # collection comes before any test runs
        "    test_skipped_module.py",
        "1 test(s): the toolkit is missing",
        "    test_not_allowed.py::test_skip_call",
        "1 test(s): could not build it",
        "    test_not_allowed.py::test_skip_in_fixture",
        "1 test(s): not on this platform",
        "    test_not_allowed.py::test_skipif_marker",
        "1 test(s): unconditional skip",
        "    test_not_allowed.py::test_skip_marker",
        "1 test(s): could not import 'a_module_that_does_not_exist'*",
        "    test_not_allowed.py::test_importorskip",
        "1 test(s): xfailed (known bug)",
        "    test_not_allowed.py::test_xfail",
        "1 test(s): xpassed (fixed bug)",
        "    test_not_allowed.py::test_xpass",
        "Make these tests run, or add the reason to ALLOWED_SKIPS*",
    ])
    # The allowed skips of test_allowed.py are not named.
    result.stdout.no_fnmatch_line("    test_allowed.py::*")


def test_a_failing_run_keeps_its_status(suite):
    suite.makepyfile(test_fails="""
import pytest

def test_fails():
    assert False

def test_skips():
    pytest.skip("some reason")
""")
    result = run(suite)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["1 test(s): some reason", "    test_fails.py::test_skips"])
