"""An upload's bytes reach the worker aligned, and PJRT puts them in place."""
import socket

import jax
import numpy as np

from jax_pathways import _core
from jax_pathways import _server
from jax_pathways.wire import payloads
from jax_pathways.worker.pjrt_backend import PjrtBackend, host_view


def test_an_uploaded_array_is_put_without_a_copy(cpu_devices):
  """A PUT made as the controller makes it (the upload taken from
  HostBuffers, sent after a JSON head) arrives with its array bytes 64-byte
  aligned, so the device array aliases the received frame: no copy of the
  upload on the worker."""
  data = np.arange(300_000, dtype=np.float32)
  hb = _server.HostBuffers()
  hb.open_session(1)
  hb.store(1, 7, data.tobytes())
  upload = payloads.Pieces(*hb.take(1, 7))
  a, b = socket.socketpair()
  dispatcher = _core.Dispatcher(2)
  dispatcher.add_island(0, a.detach(), "w0", 0)
  executor = _core.Executor(b.detach())
  for name in ("a", "a much longer name of odd length"):
    head = {"dtype": "float32", "shape": [300_000], "name": name}
    dispatcher.submit([(0, _core.OpKind.PUT, 0, [], [1],
                        payloads.parts(head, upload))], 1)
    op = executor.next(2.0)
    header, (blob,) = payloads.decode(op.payload)
    host = host_view(blob, header["dtype"], header["shape"], None)
    assert host.ctypes.data % 64 == 0
    device = cpu_devices[0]
    array = PjrtBackend.from_pieces(
        host.shape, jax.sharding.SingleDeviceSharding(device), [host],
        [device])
    assert array.unsafe_buffer_pointer() == host.ctypes.data
    np.testing.assert_array_equal(np.asarray(array), data)
