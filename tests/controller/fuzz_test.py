"""Fuzzing: random and mutated frames for every gRPC method and every
IfrtRequest kind, on a cluster of the test's own (clients over TCP), while
a legitimate client checks its results. Nothing crashes, every call is
answered within a bound, the legitimate client's answers are all right, and
what the fuzzing sessions held is gone once they are.

JAX_PATHWAYS_FUZZ_FRAMES sets the frames (10^4 by default; the slow-marked
run sends 10^5)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import numpy as np
import pytest

from jax_pathways import admin
from jax_pathways.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.integration

FRAMES = int(os.environ.get("JAX_PATHWAYS_FUZZ_FRAMES", "10000"))
PER_SESSION = 100
SESSION_END_S = 30.0  # how long a fuzzed session may take to be answered


class Legitimate(threading.Thread):
  """Uploads, fetches and checks, over and over, until stopped."""

  def __init__(self, session_cls, cluster: LocalCluster):
    super().__init__(daemon=True)
    self.session = session_cls(cluster.address, cluster.token, timeout=60)
    self.checked = 0
    self.wrong: list[str] = []
    self.stop = threading.Event()

  def run(self) -> None:
    rng = np.random.default_rng(0)
    handle = 1
    try:
      while not self.stop.is_set():
        values = rng.normal(size=int(rng.integers(1, 4096))).astype(
            np.float32)
        self.session.store(handle, values.tobytes())
        r = self.session.wait(self.session.send_make_array(
            handle, handle, values.size))
        if r.response_metadata.status.code:
          self.wrong.append(str(r.response_metadata.status))
        got = np.frombuffer(self.session.fetch(handle, handle + 1),
                            np.float32)
        if not np.array_equal(got, values):
          self.wrong.append(f"round trip {handle} returned other values")
        self.session.call(destruct_array_request=lambda b, h=handle:
                          b.array_handle.append(h))
        self.checked += 1
        handle += 2
    except Exception as e:  # pylint: disable=broad-except
      self.wrong.append(f"{type(e).__name__}: {e}")


def _fuzz_session(raw, cluster: LocalCluster, fuzzer, frames: int) -> None:
  """A session that holds four real arrays, then sends `frames` fuzzed
  requests: all answered, or its stream ended with a status."""
  session = raw.RawSession(cluster.address, cluster.token,
                           timeout=SESSION_END_S)
  for h in fuzzer.handles:
    session.store(h, np.arange(h, dtype=np.float32).tobytes())
    session.send_make_array(h, h, h)
  expected = []
  for _ in range(frames):
    data, mutated = fuzzer.request(session.next_op_id)
    op_id = session.send_raw(data)
    if not mutated:
      expected.append(op_id)
  session.half_close()
  assert session.ended(SESSION_END_S), "a fuzzed session was not answered"
  if session.error is None:
    missing = set(expected) - session.answered()
    assert not missing, f"requests never answered: {sorted(missing)[:10]}"
  else:  # an unparsable request ends the stream, with a status
    assert session.error.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                    grpc.StatusCode.CANCELLED), session.error


def _fuzz_metadata(cluster: LocalCluster, fuzzer) -> None:
  """A session opened with fuzzed metadata: refused or served, promptly."""
  target = cluster.address.split("://")[1]
  with grpc.insecure_channel(target) as channel:
    frames = [fuzzer.request(k + 1)[0] for k in range(3)]
    try:
      list(channel.stream_stream(SESSION_METHOD)(
          iter(frames), timeout=SESSION_END_S,
          metadata=[(SESSION_METADATA, fuzzer.metadata(cluster.token))]))
    except grpc.RpcError as e:
      assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, e


SESSION_METHOD = "/xla.ifrt.proxy.GrpcIfrtService/IfrtSession"
SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"

JAX_CLIENT = textwrap.dedent("""
    import sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, jax.numpy as jnp, numpy as np
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    f = jax.jit(lambda a: jnp.tanh(a @ a).sum(0))
    got = np.asarray(f(jax.device_put(x, jax.devices()[5])))
    with jax.default_device(jax.devices("cpu")[0]):
      want = np.asarray(f(x))
    assert got.tobytes() == want.tobytes(), (got, want)
    print("ok")
""")


def _fuzz(raw, cluster: LocalCluster, frames: int, seed: int) -> None:
  before = admin.status(cluster.address, cluster.token)
  legit = Legitimate(raw.RawSession, cluster)
  legit.start()
  sent = 0
  session_frames = frames * 4 // 5
  unary = raw.Fuzzer(seed, [])
  calls = unary.unary_calls(cluster.token, legit.session.id)
  target = cluster.address.split("://")[1]
  k = 0
  start = time.monotonic()
  with grpc.insecure_channel(target) as channel:
    while sent < frames:
      k += 1
      if sent < session_frames:
        n = min(PER_SESSION, session_frames - sent)
        _fuzz_session(raw, cluster, raw.Fuzzer(seed * 100_003 + k,
                                               [1, 2, 3, 4]), n)
        _fuzz_metadata(cluster, raw.Fuzzer(seed * 100_019 + k, []))
        sent += n + 3
        continue
      what, call = next(calls)
      t = time.monotonic()
      try:
        call(channel)
      except grpc.RpcError as e:
        assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, what
        assert e.code() != grpc.StatusCode.UNAVAILABLE, (what, e)
      assert time.monotonic() - t < 10, what
      sent += 1
  elapsed = time.monotonic() - start
  legit.stop.set()
  legit.join(timeout=60)
  assert not legit.wrong, legit.wrong[:5]
  assert legit.checked > 0
  for pid in cluster.pids:
    os.kill(pid, 0)  # controller and workers alive
  legit.session.close()
  # What the fuzzing sessions held is gone.
  deadline = time.monotonic() + 30
  while True:
    after = admin.status(cluster.address, cluster.token)
    if (after["live_buffers"] == before["live_buffers"] and
        not after["clients"]) or time.monotonic() > deadline:
      break
    time.sleep(0.1)
  assert after["clients"] == [], json.dumps(after["clients"])
  assert after["live_buffers"] == before["live_buffers"]
  assert after["host_buffer_bytes"] == 0
  assert all(i["alive"] for i in after["islands"])
  # Real JAX still compiles and runs, bit for bit.
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  env["JAX_PLATFORMS"] = "proxy,cpu"
  out = subprocess.run([sys.executable, "-c", JAX_CLIENT, cluster.address,
                        cluster.token], env=env, capture_output=True,
                       text=True, timeout=120, cwd="/")
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
  print(f"fuzz: {sent} frames in {elapsed:.1f} s, legitimate client "
        f"checked {legit.checked} round trips")


def test_fuzzed_frames_change_nothing_for_anyone_else(raw, tcp_cluster):
  _fuzz(raw, tcp_cluster, FRAMES, seed=1)


@pytest.mark.slow
def test_fuzzed_frames_many(raw, tcp_cluster):
  _fuzz(raw, tcp_cluster,
        int(os.environ.get("JAX_PATHWAYS_FUZZ_FRAMES_SLOW", "100000")),
        seed=2)
