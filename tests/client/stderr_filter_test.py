"""jaxlib's two known messages are kept off stderr; nothing else is."""
import io
import os
import subprocess
import sys
import textwrap

import pytest

from jax_pathways.client import stderr_filter

CREDENTIALS = (b"W1123 18:22:27.011828    6213 grpc_credentials_possibly_insecure"
               b"_wrapper.cc:63] IFRT proxy using insecure client credentials "
               b"because of environment variable.\n")
DISCONNECTED = (b"W1123 18:22:30.972875    6213 grpc_client.cc:91] IFRT proxy "
                b"server disconnected: ")
TRACE = (b"\t\n\t\n\tPy_FinalizeEx\n\tPy_RunMain\n\t_start\n"
         b"*** End stack trace ***\n\n")
SESSION_END = (DISCONNECTED + b"CANCELLED: CANCELLED; Stack trace: *** Begin "
               b"stack trace ***\n" + TRACE)


def _copy(message: str, data: bytes) -> bytes:
  out = io.BytesIO()
  stderr_filter.copy_without(message, io.BytesIO(data), out)
  return out.getvalue()


def test_drops_only_its_message():
  other = b"E1123 18:22:27.1 6213 foo.cc:1] a real error\n"
  assert _copy("credentials", CREDENTIALS + other + CREDENTIALS) == other
  assert _copy("credentials", SESSION_END) == SESSION_END
  assert _copy("session_end", other + SESSION_END + other) == other + other
  assert _copy("session_end", CREDENTIALS) == CREDENTIALS


def test_says_each_message_it_dropped():
  told = []
  stderr_filter.copy_without(
      "session_end", io.BytesIO(SESSION_END + CREDENTIALS + SESSION_END),
      io.BytesIO(), lambda: told.append(len(told)))
  assert told == [0, 1]


def test_keeps_a_disconnect_that_is_not_the_clients_own_cancel():
  lost = (DISCONNECTED + b"UNAVAILABLE: Socket closed; Stack trace: *** Begin "
          b"stack trace ***\n" + TRACE)
  assert _copy("session_end", lost) == lost


def test_keeps_a_trace_cut_short():
  cut = SESSION_END[:SESSION_END.index(b"*** End")]
  assert _copy("session_end", cut) == cut


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
  environ = dict(os.environ, **env)
  environ.pop("JAX_PLATFORMS", None)
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                        env=environ, capture_output=True, text=True,
                        timeout=120)


def _assert_quiet(stderr: str) -> None:
  for noise in ("Stack trace", "insecure client credentials",
                "IFRT proxy server disconnected", "compilation cache"):
    assert noise not in stderr, stderr[-3000:]


@pytest.mark.integration
def test_a_program_ends_quietly():
  """The client connects and is torn down at exit holding live arrays and
  executables: stderr stays empty."""
  out = _run("""
      import jax_pathways
      jax_pathways.initialize(islands=1, devices_per_island=2)
      import jax, jax.numpy as jnp
      x = jax.jit(lambda a: a * 2)(jnp.ones(4))
      print("SUM", float(x.sum()))
  """)
  assert out.returncode == 0 and "SUM 8.0" in out.stdout, out.stderr[-3000:]
  _assert_quiet(out.stderr)
  assert out.stderr == "", out.stderr[-3000:]


@pytest.mark.integration
def test_a_shutdown_under_live_arrays_is_quiet():
  """shutdown() while the program still holds an array and a jitted
  function: the client outlives the cluster, whose stop ends its session."""
  out = _run("""
      import jax_pathways
      jax_pathways.initialize(islands=1, devices_per_island=2)
      import jax, jax.numpy as jnp
      double = jax.jit(lambda a: a * 2)
      x = double(jnp.ones(4))
      print("SUM", float(x.sum()))
      jax_pathways.shutdown()
      print("STOPPED", x.is_deleted())
  """)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout == "SUM 8.0\nSTOPPED True\n", out.stderr[-3000:]
  assert out.stderr == "", out.stderr[-3000:]


@pytest.mark.integration
def test_a_dead_controller_still_shows():
  out = _run("""
      import os, signal, time
      import jax_pathways
      jax_pathways.initialize(islands=1, devices_per_island=2)
      import jax.numpy as jnp
      print("SUM", float(jnp.ones(3).sum()), flush=True)
      os.kill(jax_pathways.local_cluster().controller.pid, signal.SIGKILL)
      time.sleep(2)
      print("SUM", float((jnp.ones(3) * 2).sum()))
  """)
  assert out.returncode == 1 and out.stdout == "SUM 3.0\n", out.stderr[-3000:]
  assert "IFRT proxy server disconnected: UNAVAILABLE" in out.stderr
  assert "exited with code -9; every pending and later JAX call fails" \
      in out.stderr
  assert "jax.errors.JaxRuntimeError: UNAVAILABLE" in out.stderr
  assert "insecure client credentials" not in out.stderr


JOINED = """
import sys
import jax_pathways
for _ in range(2):
  jax_pathways.initialize(sys.argv[1])
  import jax.numpy as jnp
  print("SUM", float(jnp.ones(3).sum()))
  jax_pathways.shutdown()
"""


@pytest.mark.integration
def test_compilation_cache_warns_once(tmp_path):
  """A client joining a running controller cannot know whether its workers
  keep compiled programs (an embedded cluster's do, under JAX's cache
  directory: tests/worker/compilation_cache_test.py): it says so once per
  process, initialize() after shutdown() included; shutdown() ends the
  session quietly too."""
  joined = tmp_path / "joined.py"
  joined.write_text(JOINED)
  out = _run(f"""
      import os, subprocess, sys
      import jax_pathways
      jax_pathways.initialize(islands=1, devices_per_island=2)
      cluster = jax_pathways.local_cluster()
      env = dict(os.environ, JAX_COMPILATION_CACHE_DIR={str(tmp_path)!r},
                 JAX_PATHWAYS_TOKEN=cluster.token)
      out = subprocess.run([sys.executable, {str(joined)!r}, cluster.address],
                           env=env, capture_output=True, text=True,
                           timeout=100)
      print(out.stdout, end="")
      print(out.stderr, end="", file=sys.stderr)
  """)
  assert out.returncode == 0 and out.stdout.count("SUM 3.0") == 2, \
      out.stderr[-3000:]
  warned = [line for line in out.stderr.splitlines()
            if "persistent compilation cache" in line]
  assert len(warned) == 1 and str(tmp_path) in warned[0], out.stderr[-3000:]
  _assert_quiet(out.stderr.replace(warned[0], ""))
