"""How every process of a cluster logs: absl logging at a verbosity, and
every thread's Python stack on a crash in native code. The CLI's processes
call it, and Ray's actors, which are started by Ray rather than the CLI."""
from __future__ import annotations

import faulthandler

from absl import flags
from absl import logging


def setup_logging(verbosity: int) -> None:
  """absl logging at `verbosity` (0: INFO; 1, 2: vlog levels)."""
  faulthandler.enable(all_threads=True)
  flags.FLAGS.mark_as_parsed()  # absl logging without absl.app
  logging.use_absl_handler()
  logging.set_verbosity(verbosity)
