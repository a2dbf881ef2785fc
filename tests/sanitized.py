"""csrc/ under AddressSanitizer and ThreadSanitizer (tests/sanitizers/,
one file per mode, so that the suite's workers run them side by side):
builds the extensions with JAX_PATHWAYS_SANITIZE (BUILD.md, "Sanitizers")
into build/sanitize-*/, then runs the C++-level tests and a session churn
against them in a subprocess. Any sanitizer report, from any process,
fails the test."""
from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import TextIO

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
MODES = ("address", "thread")
SUPPRESSIONS = REPO / "tests" / "tsan_suppressions.txt"
# The tests whose code paths are C++: dispatcher and executor over socket
# pairs, worker links, the host-buffer side channel, and sessions that end
# abruptly against a controller with two workers (full size: ~5 s more,
# and 40 sessions missed the bug it guards against once in 6 runs).
TESTS = ["tests/dispatch", "tests/transport",
         "tests/controller/host_buffers_test.py",
         "tests/controller/staged_uploads_test.py",
         "tests/controller/session_churn_test.py"]
# Through the embedded cluster's workers (jaxlib's threads): covered by the
# plain run; the rest of its file is frontend, dispatcher and executor.
DESELECT = ("tests/controller/staged_uploads_test.py::"
            "test_large_device_puts_stream_to_their_worker")
# Under ASan only: the fast path (replies and reads completed from the
# dispatcher's threads). Its workers run XLA programs on 4 devices, whose
# thread churn in uninstrumented jaxlib tripped TSan's own bookkeeping
# once in CI ("dup thread with used id"), no report of ours.
ASAN_TESTS = ["tests/controller/fast_path_test.py"]


def _runtime(name: str) -> str:
  path = subprocess.run(["g++", f"-print-file-name={name}"],
                        capture_output=True, text=True,
                        check=True).stdout.strip()
  if not os.path.isabs(path):
    why = f"g++ has no {name} (install gcc's sanitizer runtimes)"
    if os.environ.get("CI") == "true":  # CI must not stop checking quietly
      pytest.fail(why + "; scripts/install_system_deps.sh installs them")
    pytest.skip(why)
  return path


def _out(mode: str) -> pathlib.Path:
  return REPO / "build" / f"sanitize-{mode}"


def _compile(mode: str, timeout_s: float) -> subprocess.CompletedProcess:
  """setup.py build_ext under `mode` into _out(mode), holding its lock: a
  build started ahead (start_builds) finishes before another begins, at
  the waiter's priority if that is higher (_hurry)."""
  out = _out(mode)
  out.mkdir(parents=True, exist_ok=True)
  deadline = time.monotonic() + timeout_s
  with open(out / "build.lock", "a+", encoding="utf-8") as lock:
    hurried = False
    while True:
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except BlockingIOError:
        assert time.monotonic() < deadline, f"{mode} build: lock held"
        if not hurried:  # once its holder has said who it is
          hurried = _hurry(lock)
        time.sleep(0.5)
    # Its holder's process group, for a build that waits on this one.
    lock.truncate(0)
    lock.write(f"{os.getpgrp()}\n")
    lock.flush()
    return subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib",
         str(out / "lib"), "--build-temp", str(out / "obj")],
        cwd=REPO, env=dict(os.environ, JAX_PATHWAYS_SANITIZE=mode),
        capture_output=True, text=True,
        timeout=max(1.0, deadline - time.monotonic()))


def _hurry(lock: TextIO) -> bool:
  """A test now waits for a build started at nice 19 (start_builds): the
  build's process group gets this process's priority if that is higher,
  where it may (raising one needs CAP_SYS_NICE, which CI's root has).
  Whether the lock named its holder."""
  lock.seek(0)
  holder = lock.read().strip()
  if not holder.isdigit():
    return False
  mine = os.getpriority(os.PRIO_PROCESS, 0)
  try:
    if os.getpriority(os.PRIO_PGRP, int(holder)) > mine:  # never lowered
      os.setpriority(os.PRIO_PGRP, int(holder), mine)
  except OSError:  # not allowed, or the build has just ended
    pass
  return True


def start_builds() -> list[subprocess.Popen]:
  """Both modes' builds, started now at the lowest priority: the suite's
  tests leave the cores idle at times while they wait on processes, and
  the builds (about a minute of compiling each from scratch) fill that.
  The tests then find them done, or wait for them (_compile's lock)."""
  return [subprocess.Popen(
      ["nice", "-n", "19", sys.executable, __file__, mode], cwd=REPO,
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      start_new_session=True)  # its compilers are stopped with it
          for mode in MODES]


def stop_builds(builds: list[subprocess.Popen]) -> None:
  """Kills those of start_builds' builds still running (a run cut short),
  with their compilers; a killed link may leave a partial module, which
  a later build would take for done: their outputs go too."""
  for mode, build in zip(MODES, builds):
    if build.poll() is None:
      os.killpg(build.pid, signal.SIGKILL)
      build.wait()
      shutil.rmtree(_out(mode) / "lib", ignore_errors=True)


def _build(mode: str) -> pathlib.Path:
  """The package with both extensions built under `mode`, in a tree of
  its own (incremental: build/ is kept between runs)."""
  build = _compile(mode, timeout_s=900)
  assert build.returncode == 0, build.stderr[-4000:]
  out = _out(mode)
  tree = out / "tree"
  shutil.rmtree(tree, ignore_errors=True)
  shutil.copytree(REPO / "jax_pathways", tree / "jax_pathways",
                  ignore=shutil.ignore_patterns("*.so", "__pycache__"))
  for so in (out / "lib" / "jax_pathways").glob("*.so"):
    shutil.copy2(so, tree / "jax_pathways")
  return tree


# Lines of a sanitizer's log that report nothing about our code:
# - a refused absurd allocation (host_buffers_test announces 2**62 bytes);
# - TSan's thread registry meeting a pthread id again while it still holds
#   an earlier thread of that id, one started and ended inside jaxlib or
#   grpc (uninstrumented: ignore_noninstrumented_modules), whose end it did
#   not see; TSan goes on (a CI run of the tests under it passed, with only
#   this line in the log).
_NOT_REPORTS = ("AddressSanitizer failed to allocate",
                "ThreadSanitizer: dup thread with used id")


def _report(path: pathlib.Path) -> str:
  """A sanitizer's log, less the lines that report nothing (_NOT_REPORTS)."""
  return "".join(
      line for line in path.read_text().splitlines(keepends=True)
      if line.strip() and not any(n in line for n in _NOT_REPORTS))


def check(mode: str, tmp_path: pathlib.Path) -> None:
  """Builds csrc/ under `mode` and runs the tests above against it."""
  runtime = _runtime("libasan.so" if mode == "address" else "libtsan.so")
  tree = _build(mode)
  logs = tmp_path / "reports"
  logs.mkdir()
  env = dict(os.environ, PYTHONPATH=str(tree),
             # The runtime must come first; libstdc++ too, or the
             # sanitizer's __cxa_throw interceptor finds no real one (python
             # itself does not link libstdc++) and aborts at the first throw.
             LD_PRELOAD=f"{runtime} {_runtime('libstdc++.so')}")
  # Allocation failures are data here (ResourceExhausted), not bugs.
  common = (f"log_path={logs}/report:exitcode=66:halt_on_error=1:"
            f"allocator_may_return_null=1")
  # CPython frees little at exit by design: leak reports would be noise.
  env["ASAN_OPTIONS"] = f"{common}:detect_leaks=0"
  # Python, jaxlib and grpc are not instrumented: their own hand-offs
  # (atomics TSan cannot see) would read as races in memcpy/free called
  # from them. Our code and the grpc++ headers compiled into it still are.
  # die_after_fork=0: TSan otherwise kills a child forked from a threaded
  # process that starts a thread; one does here between subprocess's fork
  # (start_new_session rules out posix_spawn) and exec. csrc/ never forks.
  env["TSAN_OPTIONS"] = (f"{common}:ignore_noninstrumented_modules=1:"
                         f"die_after_fork=0:suppressions={SUPPRESSIONS}")
  tests = [str(REPO / t) for t in TESTS]
  tests += ["--deselect", str(REPO / DESELECT)]
  if mode == "address":
    tests += [str(REPO / t) for t in ASAN_TESTS]
  # cwd is the tree, so that `-m pytest` imports the sanitized package.
  run = subprocess.run(
      [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
       # Two processes, each watched: most of these tests wait (heartbeats,
       # timeouts), so they overlap well.
       "-n", "2", "--dist", "loadfile",
       "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"),
       *tests],
      cwd=tree, env=env, capture_output=True, text=True, timeout=1500)
  reports = [text for text in (_report(r) for r in sorted(logs.iterdir()))
             if text]
  assert not reports, "\n".join(text[:6000] for text in reports)
  assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]


if __name__ == "__main__":  # start_builds' processes: `sanitized.py MODE`
  sys.exit(_compile(sys.argv[1], timeout_s=1800).returncode)
