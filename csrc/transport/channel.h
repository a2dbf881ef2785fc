// Channel: length-prefixed frames over a connected stream socket.
//
// The socket is connected and authenticated by Python before it is handed
// over; the Channel owns the fd from then on.
//
// Sending never blocks on the peer in SendMany(): it writes what the socket
// takes at once (MSG_DONTWAIT; with room, one sendmsg and no thread hop) and
// queues the rest, which the channel's writer thread writes in order. Once
// anything is queued, later frames go behind it, so frames leave in the order
// their SendMany() calls took the channel. A peer that stops reading (a
// frozen worker) thus costs memory, shown by backlog_bytes(), and never a
// caller's thread. Send() instead returns only once the kernel has its frame
// (behind the queue): its bytes are the caller's, lent for the call.
//
// A write error, on any thread, closes the channel both ways: the reader then
// sees the broken connection, and later sends fail. Receive() returns a
// Status on EOF, a malformed header or a length this process cannot
// allocate, so a dead or confused peer shows up as an error value.
//
// Thread safety: Send*() and backlog_bytes() from any thread (frames never
// interleave); Receive() from one reader thread only; Shutdown() from any
// thread. An `owner` is dropped on the writer thread, so it must not own the
// Channel (the writer cannot join itself).
#ifndef JAX_PATHWAYS_CSRC_TRANSPORT_CHANNEL_H_
#define JAX_PATHWAYS_CSRC_TRANSPORT_CHANNEL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"

namespace jax_pathways {

enum class FrameKind : uint32_t {
  kOp = 1,        // controller -> worker: an Op
  kEvent = 2,     // worker -> controller: an Event
  kTransfer = 3,  // worker -> worker: transfer id + bytes
  // worker -> worker on one host: transfer id + where the sender holds the
  // bytes (pid, address, length), for the receiver to copy them itself
  kTransferLocal = 4,
  kTransferAck = 5,  // worker -> worker: a local transfer was copied (or not)
  // controller -> worker on one host: the stage its tails may be in (u64,
  // 0: none; see kStage), where the controller holds the op's payload
  // tails (u32 count, then a Location each, local_reads.h), then the op
  // frame without them
  kOpLocal = 6,
  // controller -> worker on one host: a Location of kReadProbePattern, to
  // learn whether the worker may read the controller's memory
  kReadProbe = 7,
  kReadProbeAck = 8,  // worker -> controller: u32 1 if it could, else 0
  // worker -> controller and controller -> worker, empty, every
  // kHeartbeatInterval: the process still runs (a stopped or wedged one is
  // told from a slow one by its silence)
  kHeartbeat = 9,
  // controller -> worker on one host, out of gang order: part of an upload
  // still arriving, for the worker to copy now into a stage (u64 stage,
  // u64 total bytes, u64 offset, then Locations as in kOpLocal); the PUT
  // that names the stage takes it instead of reading its tails then
  kStage = 10,
  kUnstage = 11,  // controller -> worker: u64 stage, no PUT will take it
  // controller -> worker on another host, out of gang order: part of an
  // upload still arriving (u64 stage, u64 total, u64 offset, then the
  // bytes), in order from the first; the worker keeps them in the stage
  kStageData = 12,
  // controller -> worker on another host: u64 stage, then an op frame
  // whose payload's tails are the stage's bytes, all of them (kStageData)
  kOpStaged = 13,
};

// How often a worker says it is alive, and the controller to each worker;
// either side's timeout must be several of these.
inline constexpr std::chrono::milliseconds kHeartbeatInterval{1000};

class Channel {
 public:
  explicit Channel(int fd);
  // Shutdown(), then closes the fd.
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Writes one frame whose body is `head` followed by `body`; returns once
  // the kernel has all of it.
  Status Send(FrameKind kind, std::string_view head, std::string_view body);
  Status Send(FrameKind kind, std::string_view body) {
    return Send(kind, body, {});
  }
  // Several frames (head + body + tails each), with as few syscalls as the
  // kernel allows; never blocks. `owner` keeps every body and tail alive
  // until written (null if they are empty or static); heads are moved in.
  // `now`: write what the socket takes on this thread, else leave it all
  // to the writer thread (bulk bytes sent from a thread others wait on).
  // Fails only if the channel is closed or the first write fails.
  struct Frame {
    FrameKind kind;
    std::string head;
    std::string_view body;
    std::vector<std::string_view> tails = {};
  };
  Status SendMany(std::vector<Frame> frames,
                  std::shared_ptr<const void> owner, bool now = true);
  // Bytes accepted by SendMany()/Send() and not yet taken by the kernel.
  size_t backlog_bytes();
  // Where the body of a frame of `kind` goes past its first `head` bytes
  // (all of it, if shorter), instead of a fresh buffer: place(those bytes,
  // n) returns room for the other n, or an error that Receive() returns
  // without reading them (the stream is then out of step: the reader must
  // give up the connection).
  struct Placement {
    FrameKind kind;
    size_t head;
    std::function<StatusOr<char*>(std::string_view head, size_t n)> place;
  };
  // Reads one whole frame into a fresh buffer (with `placement`, one it
  // places: `body` is then its head only). Small frames sent together cost
  // one recv() between them: the reader takes what the socket has.
  Status Receive(FrameKind* kind, Bytes* body,
                 const Placement* placement = nullptr);
  // Unblocks a pending Receive(), stops and joins the writer, drops what is
  // queued and makes later calls fail. Idempotent.
  void Shutdown();
  // Whether the peer is on this host (a Unix socket).
  bool IsLocal() const;
  // When Receive() last got bytes, those of a frame still arriving too: a
  // peer sending a frame that takes seconds (an upload, a fetch) is alive
  // while it arrives, though no whole frame, not even a heartbeat queued
  // behind it, has come. Thread-safe; the epoch before any byte.
  std::chrono::steady_clock::time_point LastReceived() const;

 private:
  struct Batch;  // frames being sent, with their iovecs and owner
  // Queues `batch` unless the socket takes all of it now; returns its ticket
  // (0: written already). Requires mu_.
  StatusOr<uint64_t> WriteOrQueue(std::unique_ptr<Batch> batch,
                                  bool now = true);
  void WriteLoop();
  // Receive()'s: the next `n` bytes of the stream to `w`.
  Status ReadInto(char* w, size_t n);
  // Require mu_. Makes later sends fail with `why` and shuts the socket down
  // (waking the reader and a blocked writer).
  void CloseLocked(const Status& why);
  // Empties the queue, for the caller to destroy without mu_.
  std::deque<std::unique_ptr<Batch>> DropQueueLocked();

  const int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  Status closed_;  // why sends fail; OK while open
  std::deque<std::unique_ptr<Batch>> queue_;  // behind the one being written
  bool writing_ = false;   // the writer holds a batch outside queue_
  size_t backlog_ = 0;     // unwritten bytes of queue_ and the writer's batch
  uint64_t queued_ = 0;    // tickets handed out (batches ever queued)
  uint64_t finished_ = 0;  // batches written, in ticket order
  std::thread writer_;     // started when a batch is first queued
  // LastReceived(), in steady_clock ticks; written by the reader alone.
  std::atomic<std::chrono::steady_clock::rep> last_received_{0};
  // Receive()'s: bytes read past the frame it returned, at
  // [read_start_, read_end_) of read_buffer_ (allocated at first use).
  std::unique_ptr<char[]> read_buffer_;
  size_t read_start_ = 0;
  size_t read_end_ = 0;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_TRANSPORT_CHANNEL_H_
