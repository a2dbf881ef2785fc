"""csrc/'s C++-level tests under AddressSanitizer (tests/sanitized.py)."""
import pytest

import sanitized  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration


@pytest.mark.timeout(1800)
def test_cpp_tests_pass_under_address_sanitizer(tmp_path):
  sanitized.check("address", tmp_path)
