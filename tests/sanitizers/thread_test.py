"""csrc/'s C++-level tests under ThreadSanitizer (tests/sanitized.py)."""
import pytest

import sanitized  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration


@pytest.mark.timeout(1800)
def test_cpp_tests_pass_under_thread_sanitizer(tmp_path):
  sanitized.check("thread", tmp_path)
