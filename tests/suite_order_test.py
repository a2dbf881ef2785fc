"""suite_order.LONGEST_FIRST names files that exist (a moved file would
silently run last again)."""
import os

import suite_order  # tests/ is on sys.path (conftest.py)


def test_the_longest_files_exist():
  here = os.path.dirname(__file__)
  missing = [f for f in suite_order.LONGEST_FIRST
             if not os.path.isfile(os.path.join(here, f))]
  assert not missing
