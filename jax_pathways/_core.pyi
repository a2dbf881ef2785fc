"""Stubs of the C++ core (csrc/): the contract between Python and C++.

Blocking methods release the GIL. Statuses travel as (code, message) with
absl/gRPC codes; raised errors are ValueError (INVALID_ARGUMENT),
NotImplementedError (UNIMPLEMENTED), TimeoutError (DEADLINE_EXCEEDED) or
JaxPathwaysError (everything else, with `.code`).
"""
import enum
from typing import Any, Sequence

import numpy as np

WIRE_VERSION: int
# How a worker words (DATA_LOSS) a spanning program's broken link to another
# island's worker; the dispatcher holds such a failure for the loss's words.
BROKEN_LINK: str

class JaxPathwaysError(RuntimeError):
  code: int

class OpKind(enum.IntEnum):
  COMPILE = 1
  LAUNCH = 2
  PUT = 3
  FETCH = 4
  DELETE = 5
  SEND = 6
  RECEIVE = 7
  COPY = 8
  SHUTDOWN = 9
  TRACE = 10
  PEER_LOST = 11
  JOIN_GLOBAL = 12
  SAVE = 13
  LOAD = 14
  COLOCATED = 15

class Op:
  """An op as a worker receives it."""
  kind: OpKind
  seq: int
  program: int
  args: list[int]
  results: list[int]
  payload: np.ndarray  # read-only uint8 view, valid while the Op lives

# (island, kind, program, args, results, payload)
# The payload: bytes, or (head, tail) sent as head + tail; a tail that is a
# view of a HostBuffers upload is shared, not copied.
IslandOp = tuple[int, OpKind, int, Sequence[int], Sequence[int],
                 bytes | tuple[bytes, Any]]
# (tag, code, message, payloads)
Completion = tuple[int, int, str, list[bytes]]

class Dispatcher:
  """The controller's ordering, futures and in-flight windows."""
  def __init__(self, max_in_flight: int) -> None: ...
  def add_island(self, island: int, fd: int, name: str,
                 memory_bytes: int = 0) -> None: ...
  def submit(self, gang: Sequence[IslandOp], tag: int, client: int = 0,
             result_bytes: Sequence[Sequence[int]] = (),
             stages: Sequence[int] = (),
             fails_with: Sequence[int] = ()) -> None:
    """result_bytes[i][k]: device memory of op i's result k on its island;
    stages[i]: the stage op i (a PUT) may take its tails from (0: none);
    fails_with[i]: a buffer op i needs but does not take (a receive's
    source), failed by the time op i is numbered, fails it too (0: none)."""
  def new_stage(self) -> int: ...
  def stream_upload(self, stage: int,
                    dests: Sequence[tuple[int, int, int]]) -> Any:
    """A stream capsule for HostBuffers.take: an upload forwarded as it
    arrives into `stage` on each (island, stage's total bytes, offset of
    the upload in the stage)."""
  def unstage(self, islands: Sequence[int], stage: int) -> None: ...
  def set_weight(self, client: int, weight: float) -> None: ...
  def forget_client(self, client: int) -> None: ...
  def expire_memory_waits(self, max_wait_s: float) -> None: ...
  def expire_silent_islands(self, timeout_s: float) -> None: ...
  def shares(self) -> list[dict]: ...
  def when_ready(self, ids: Sequence[int], tag: int) -> None: ...
  def state(self, id: int) -> tuple[str, tuple[int, str]]: ...
  def cork(self) -> None: ...
  def uncork(self) -> None: ...
  def forget(self, ids: Sequence[int]) -> None: ...
  def fail_island(self, island: int, code: int, message: str) -> None: ...
  def note_loss(self, island: int, note: str) -> None: ...
  def poll(self, timeout_s: float, max_items: int = 1024) -> list[Completion]: ...
  def stats(self) -> list[dict]: ...
  def live_buffers(self) -> int: ...
  def new_buffers(self, n: int) -> list[int]: ...
  def new_transfers(self, n: int) -> list[int]: ...
  @property
  def epoch(self) -> int:
    """Changes whenever an island is lost or rejoins."""
  def shutdown(self) -> None: ...

# A fast-path record: (buffer, layout id, island ids, donated, the buffer
# whose memory it is part of or 0).
ArrayRecord = tuple[int, int, list[int], bool, int]

class ShardPlan:
  """How the fast path splits an array of one layout into single-device
  arrays: per device its shard's layout (one: the array itself, another
  handle), whether it is replicated, the COPY payloads making the first
  shard and every one, and (with several) each shard's own plan."""
  def __init__(self, island: int, layouts: Sequence[int], replicated: bool,
               first: bytes, all: bytes,
               shard_plans: Sequence[ShardPlan | None]) -> None: ...

class FastPath:
  """Execute, CheckValueReady, DestructArray, uploads and reads answered
  in C++ (csrc/controller/fast_path/fast_path.h; controller/array_store.py)."""
  def __init__(self, dispatcher: Dispatcher, wait_max_bytes: int,
               server_handles_start: int) -> None:
    """`wait_max_bytes`: the largest upload whose request, come before its
    bytes, waits for them in C++ (larger ones stream, through Python);
    `server_handles_start`: the first handle the controller mints (result
    handles from there on are Python's to refuse)."""
  def attach(self, sink: object) -> None:
    """`sink`: GrpcServer.reply_sink()'s capsule."""
  def detach(self) -> None: ...
  def hook(self) -> object:
    """A capsule for GrpcServer.set_request_hook."""
  def open(self, stream: int, client: int, host_session: int) -> None: ...
  def close(self, stream: int) -> list[ArrayRecord]: ...
  def put(self, stream: int, handle: int, buffer: int, layout: int,
          islands: Sequence[int], shards: ShardPlan | None) -> bool: ...
  def take(self, stream: int, handle: int) -> list[tuple[int, ArrayRecord]]:
    """`handle`'s record and every record linked to it (other handles of
    its buffer, shards sharing its memory), `handle`'s first, moved out;
    [] if not here."""
  def contains(self, stream: int, handle: int) -> bool: ...
  def count(self, stream: int) -> int: ...
  def records(self, stream: int) -> list[tuple[int, ArrayRecord]]: ...
  def note_client_handle(self, stream: int, handle: int) -> None: ...
  def register(self, stream: int, executable: int, epoch: int,
               arg_layouts: Sequence[Sequence[int]],
               output_layouts: Sequence[int],
               output_islands: Sequence[Sequence[int]],
               output_shards: Sequence[ShardPlan | None],
               donated: Sequence[int], schedule: tuple[Any, ...]) -> None:
    """A program Python launched once on arguments of these layouts: the
    launches alike, at the same dispatcher epoch, submit `schedule`
    (controller/gangs.py Schedule.for_fast_path())."""
  def unregister(self, stream: int, executable: int) -> None: ...
  def register_upload(self, stream: int, array: int,
                      upload_bytes: Sequence[int],
                      arrays: Sequence[tuple[Any, ...]], epoch: int) -> None:
    """What Python made of the upload request whose first new array was
    `array`: the size of each upload it names, and per array (layout,
    shard plan, puts), each put (island, device memory there, PUT head,
    blobs), each blob (padding before it, which upload); the dispatcher
    epoch it placed them at. For the fast path's uploads alike."""
  def set_fetch_payload(self, fetch: bytes) -> None:
    """The payload of a dense row-major FETCH."""
  def stats(self) -> dict[str, int]: ...
  def paid_or_wake(self, stream: int) -> bool:
    """Whether `stream` is owed no reply that comes later (CheckValueReady,
    CopyToHostBuffer); if one is, the frontend's loop is woken once the
    last is sent. A stream its client closed ends once paid."""

class Executor:
  """A worker's end of the controller channel: ops in gang order."""
  def __init__(self, controller_fd: int, controller: str = "",
               controller_timeout_s: float = 0.0) -> None: ...
  def next(self, timeout_s: float) -> Op | None: ...
  def next_batch(self, timeout_s: float, max_ops: int) -> list[Op]:
    """The ops that have arrived, in order (at most max_ops): one wake-up
    for a burst; [] after timeout_s without one."""
  def complete(self, seq: int, code: int, message: str, payload: bytes,
               device_seconds: float = 0.0) -> None:
    """Reports op `seq`. A payload of at most 64 KiB is copied and sent
    without waiting, the GIL held; a larger one releases the GIL until the
    socket has taken it. `device_seconds`: how long a launch held the
    island (what fair sharing charges its client; 0: the controller
    measures it, network included)."""
  def backlog(self) -> int: ...
  def pending_losses(self) -> list[tuple[int, int, str]]:
    """PEER_LOST notices not handed out yet: (island, upto, why); upto is
    the last op numbered for this island before the loss."""
  @property
  def staged_puts(self) -> tuple[int, int]:
    """PUTs that took their stage, and those that read their tails."""
  def lost(self) -> str:
    """Why the controller is gone or silent; empty while connected."""
  def shutdown(self) -> None: ...

class PeerLinks:
  """A worker's data links to other workers."""
  def __init__(self) -> None: ...
  def add(self, fd: int, peer_name: str) -> int: ...
  def send(self, link: int, transfer_id: int, code: int, message: str,
           data: bytes) -> None: ...
  def receive(self, link: int, transfer_id: int, timeout_s: float) -> np.ndarray: ...
  def close(self, link: int, why: str) -> None:
    """The peer is lost: the link's sends and receives fail now."""
  def shutdown(self) -> None: ...
