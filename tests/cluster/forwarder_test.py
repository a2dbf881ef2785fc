"""`jax-pathways connect` and the refusal a token-less client gets (issue 19,
item 3): a pathwaysutils-only client (JAX_PLATFORMS=proxy,
JAX_BACKEND_TARGET, pathwaysutils.initialize(), jax_pathways not importable)
against a CLI cluster with a token. Every process started is stopped by pid
at the end; every wait is bounded."""
from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any, Iterator

import grpc
import numpy as np
import pytest

from jax_pathways import cli
from jax_pathways.cluster import forwarder
from jax_pathways.wire.session_keys import SESSION_METADATA, TOKEN_KEY
from jax_pathways.wire import protos

import cli_cluster  # tests/conftest.py puts tests/ on sys.path
import processes

CWD = tempfile.gettempdir()  # outside the checkout (see cli_test.py)
TOKEN = "forwarder-test-token"
SESSION = "/xla.ifrt.proxy.GrpcIfrtService/IfrtSession"

# jax_pathways is installed here and registers a jax_plugins entry point
# whose 'proxy' factory would replace pathwaysutils' one: the client makes it
# unimportable, as on a machine without it, and says whose factory JAX used.
CLIENT = textwrap.dedent("""
    import importlib.abc, json, sys, time

    class NoJaxPathways(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "jax_pathways":
          raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, NoJaxPathways())
    start = time.monotonic()
    import pathwaysutils
    pathwaysutils.initialize()
    import jax, jax.numpy as jnp, numpy as np
    from jax._src import xla_bridge
    factory = xla_bridge._backend_factories["proxy"].factory.__module__
    try:
      x = np.arange(24, dtype=np.float32).reshape(4, 6)
      y = jax.jit(lambda a: ((a * 3 - 1) / 2, jnp.sum(a * a, axis=1)))(x)
      # 12 MiB each way: past gRPC's default 4 MiB message limit.
      big = np.arange(3 << 20, dtype=np.int32)
      big_ok = bool((np.asarray(jax.jit(lambda b: b * 2 + 1)(big)) ==
                     big * 2 + 1).all())

      def attempt(fn):  # callbacks: this process cannot serve them
        try:
          jax.block_until_ready(fn())
        except Exception as e:
          return str(e)

      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      split = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("d",)),
                            P("d"))
      printed = attempt(lambda: jax.jit(
          lambda a: jax.debug.print("{}", a) or a)(x))
      inspected = attempt(lambda: jax.jit(
          lambda a: jax.debug.inspect_array_sharding(a, callback=print) or a)(
              jax.device_put(x, split)))
      still = np.asarray(jax.jit(lambda a: a + 1)(x)).tobytes().hex()
      # pathwaysutils' elastic Manager: its slices, and a retried call.
      from pathwaysutils.elastic import manager as elastic_manager
      manager = elastic_manager.Manager()
      retried = manager.elastic_retry(max_retries=1, minimum_slice_count=1,
                                      poll_interval=1, timeout=30)(
          lambda: float(jax.jit(jnp.sum)(x)))()
      slices = sorted(manager.active_slice_indices)
      print(json.dumps({"factory": factory, "n": len(jax.devices()),
                        "y": [np.asarray(v).tobytes().hex() for v in y],
                        "big_ok": big_ok, "printed": printed,
                        "inspected": inspected, "still": still,
                        "slices": slices, "retried": retried,
                        "jax_pathways": "jax_pathways" in sys.modules}))
    except Exception as e:
      print(json.dumps({"factory": factory, "error": str(e),
                        "s": time.monotonic() - start}))
""")


def _env(target: str, **extra: str) -> dict[str, str]:
  """A client's environment: nothing of JAX's or ours but what `connect`
  prints for `target` (cli.client_exports), and `extra`."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_", "PATHWAYS_", "IFRT_"))}
  for line in cli.client_exports(target):
    name, value = line[len("export "):].split("=", 1)
    env[name] = value
  env.update(extra)
  return env


def _client(target: str, **extra: str) -> dict[str, Any]:
  out = subprocess.run([sys.executable, "-c", CLIENT], env=_env(target,
                                                                **extra),
                       capture_output=True, text=True, timeout=120, cwd=CWD)
  assert out.stdout.strip(), out.stderr[-3000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  # pathwaysutils' own backend connected, not jax_pathways' plugin.
  assert got["factory"] == "pathwaysutils.proxy_backend", got
  got["stderr"] = out.stderr
  return got


def _line(proc: subprocess.Popen, timeout: float) -> str:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if select.select([proc.stdout], [], [], 0.2)[0]:
      text = proc.stdout.readline()
      if text:
        return text.strip()
    if proc.poll() is not None:
      break
  proc.kill()
  raise AssertionError(f"no line within {timeout} s:\n{proc.stderr.read()}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
  """A controller with a token and one worker of 2 devices, from the CLI."""
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  env.pop("JAX_PLATFORMS", None)
  procs = []
  try:
    yield cli_cluster.start(env, 1, procs, "--devices", "2")
  finally:
    processes.stop(procs)


def _connect(address: str, *args: str, token: str | None = None
             ) -> tuple[subprocess.Popen, str]:
  env = dict(os.environ)
  env.pop("JAX_PATHWAYS_TOKEN", None)
  if token is not None:
    env["JAX_PATHWAYS_TOKEN"] = token
  proc = cli_cluster.spawn("connect", "--controller", address, *args,
                           env=env)
  # One write: the lines after the first are in the reader's buffer.
  lines = [_line(proc, 60)] + [proc.stdout.readline().strip()
                               for _ in range(2)]
  assert lines[0].startswith("export JAX_BACKEND_TARGET=grpc://unix:"), lines
  target = lines[0].split("=", 1)[1]
  # Exactly what the client's environment gets (_env).
  assert lines == cli.client_exports(target), lines
  return proc, target


@pytest.mark.integration
def test_pathwaysutils_client_through_connect(cluster):
  proc, target = _connect(cluster["address"], token=TOKEN)
  try:
    folder = os.path.dirname(target[len("grpc://unix:"):])
    assert os.stat(folder).st_mode & 0o777 == 0o700
    got = _client(target)
    assert "error" not in got, got
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    want = [((x * 3 - 1) / 2).tobytes().hex(),
            np.sum(x * x, axis=1).tobytes().hex()]
    assert got["y"] == want and got["n"] == 2 and got["big_ok"]
    assert not got["jax_pathways"]
    # Callbacks need jax_pathways in the client's process: a clear error
    # each (JAX's client refuses host callbacks itself), no crash, and the
    # session goes on.
    assert "Unsupported host callback type" in got["printed"], got
    assert "does not serve callbacks" in got["inspected"], got
    assert "jax_pathways.initialize" in got["inspected"], got
    assert got["still"] == (x + 1).tobytes().hex()
    assert got["slices"] == [0] and got["retried"] == float(np.sum(x)), got
  finally:
    processes.stop([proc])
  assert proc.returncode == 0  # SIGTERM: a clean stop
  assert not os.path.exists(folder)  # the folder it made, socket and all
  # A session's normal end is no error of the forwarder's.
  said = proc.stderr.read()
  assert "Traceback" not in said and "Exception iterating" not in said, said
  # A healthy session says nothing at WARNING or above.
  assert not processes.LOUD.search(said), said


@pytest.mark.integration
@pytest.mark.parametrize("how", ["direct", "wrong_token"])
def test_missing_or_wrong_token_is_reported_at_once(cluster, how, tmp_path):
  procs = []
  if how == "direct":  # no token at all
    target = f"grpc://{cluster['address']}"
  else:
    token_file = tmp_path / "token"
    token_file.write_text("not-the-token\n")
    token_file.chmod(0o600)
    proc, target = _connect(cluster["address"], "--token-file",
                            str(token_file))
    procs.append(proc)
  try:
    # JAX's client retries a failed InitRequest until this timeout (120 s
    # unless set, which _client's own bound would catch); it logs the
    # controller's message on every try.
    got = _client(target, PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS="5")
  finally:
    processes.stop(procs)
  assert "UNAUTHENTICATED" in got["error"], got["error"]
  assert "wrong or missing cluster token" in got["error"]
  assert "jax-pathways connect" in got["error"]
  assert "init: UNAUTHENTICATED: jax_pathways: wrong or missing" in (
      got["stderr"])


def _metadata(other: bool = False) -> bytes:
  meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata")()
  meta.version.protocol_version = 25
  if other:
    meta.initialization_data.attributes["other"].string_value = b"kept"
  return meta.SerializeToString()


def test_with_token_adds_the_token():
  meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata").FromString(
      forwarder.with_token(_metadata(other=True), "t0k"))
  attributes = meta.initialization_data.attributes
  assert attributes[TOKEN_KEY].string_value == b"t0k"
  assert attributes["other"].string_value == b"kept"
  assert meta.version.protocol_version == 25


def test_socket_folder_must_be_private(tmp_path):
  loose = tmp_path / "loose"
  loose.mkdir(mode=0o755)
  os.chmod(loose, 0o755)
  with pytest.raises(PermissionError, match="chmod 700"):
    forwarder.serve("127.0.0.1:1", TOKEN, str(loose / "proxy.sock"))
  out = subprocess.run(
      [sys.executable, "-m", "jax_pathways.cli", "connect", "--controller",
       "127.0.0.1:1", "--listen", f"unix:{loose}/proxy.sock"],
      env=dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN), capture_output=True,
      text=True, timeout=60, cwd=CWD)
  assert out.returncode == 2 and "chmod 700" in out.stderr, out.stderr
  out = subprocess.run(
      [sys.executable, "-m", "jax_pathways.cli", "connect", "--controller",
       "127.0.0.1:1", "--listen", "127.0.0.1:0"],
      env=dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN), capture_output=True,
      text=True, timeout=60, cwd=CWD)
  assert out.returncode == 2 and "unix:/path only" in out.stderr, out.stderr


def test_garbage_is_answered(tmp_path):
  """Bad calls get a status; the forwarder serves on (no controller needed:
  they end before anything is forwarded, or find no controller)."""
  folder = tmp_path / "private"
  folder.mkdir(mode=0o700)
  path = str(folder / "proxy.sock")
  server = forwarder.serve("127.0.0.1:1", TOKEN, path)
  channel = grpc.insecure_channel(f"unix:{path}")
  try:
    def session(metadata: bytes) -> grpc.RpcError:
      call = channel.stream_stream(SESSION)(
          iter([b"\xff\x00garbage"]), metadata=[(SESSION_METADATA, metadata)],
          timeout=30)
      with pytest.raises(grpc.RpcError) as e:
        list(call)
      return e.value

    bad = session(b"\xff\xff\xff not a proto")
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
    assert "unparsable session metadata" in bad.details()
    # Well-formed, but the controller is not there: UNAVAILABLE, at once.
    assert session(_metadata()).code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as e:
      channel.unary_unary("/no.Such/Method")(b"x", timeout=30)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
  finally:
    channel.close()
    server.stop(grace=None).wait(10)


@contextlib.contextmanager
def _forwarding(address: str, tmp_path, slots: int, timeout: float
                ) -> Iterator[tuple[str, Any]]:
  """A forwarder letting `slots` sessions wait `timeout` s for their first
  request: (its socket path, a function opening a stream that never sends
  one)."""
  folder = tmp_path / "private"
  folder.mkdir(mode=0o700)
  path = str(folder / "proxy.sock")
  server = forwarder.serve(address, TOKEN, path, max_pending=slots,
                           first_message_timeout=timeout)
  channel = grpc.insecure_channel(f"unix:{path}")
  never = threading.Event()

  def nothing() -> Iterator[bytes]:
    never.wait(120)
    return
    yield  # pylint: disable=unreachable

  def idle() -> Any:
    return channel.stream_stream(SESSION)(
        nothing(), metadata=[(SESSION_METADATA, _metadata())], timeout=120)

  try:
    yield path, idle
  finally:
    never.set()
    channel.close()
    server.stop(grace=None).wait(10)


def _real_session(path: str) -> int:
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..",
                                  "controller"))
  from raw_client import RawSession  # pylint: disable=import-outside-toplevel
  return RawSession(f"grpc://unix:{path}", None).id


@pytest.mark.integration
def test_sessions_that_never_start_do_not_lock_others_out(cluster, tmp_path):
  """Streams that never send their InitRequest are ended after the
  forwarder's first-message timeout, so they cannot hold all its slots."""
  slots = 4
  with _forwarding(cluster["address"], tmp_path, slots, 1.0) as (path, idle):
    calls = [idle() for _ in range(slots)]
    for call in calls:
      with pytest.raises(grpc.RpcError) as e:
        list(call)
      assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
      assert "no first request within 1 s" in e.value.details()
    assert _real_session(path)  # every slot is free again


@pytest.mark.integration
def test_streams_kept_idle_never_lock_a_session_out(cluster, tmp_path):
  """A process of the same user keeps as many streams open as the
  forwarder lets wait for their first request, re-opening each one ended
  (issue 53 row 9): a real session still gets in, ending the oldest idle
  stream, and so does the next."""
  slots = 4
  with _forwarding(cluster["address"], tmp_path, slots, 120.0) as (path,
                                                                   idle):
    calls = [idle() for _ in range(2 * slots)]  # each re-opened once
    assert _real_session(path) and _real_session(path)
    # A newcomer finding `slots` waiting ended the one waiting longest (in
    # the order they reached the forwarder): the 4 re-opened ones, and the
    # first real session (the second found room).
    deadline = time.monotonic() + 60
    while sum(call.done() for call in calls) < slots + 1:
      assert time.monotonic() < deadline, [c.done() for c in calls]
      time.sleep(0.05)
    ended = [call for call in calls if call.done()]
    assert len(ended) == slots + 1
    for call in ended:
      assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, call.details()
      assert "ended for a newer session" in call.details()
