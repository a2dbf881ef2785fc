// Channel: length-prefixed frames over a connected stream socket.
//
// The socket is connected and authenticated by Python before it is handed
// over; the Channel owns the fd from then on. Send() may be called from any
// thread (frames never interleave); Receive() from one reader thread only.
// Both block with no locks of the caller held and return a Status on EOF or a
// malformed header, so a dead or confused peer shows up as an error value.
#ifndef JAX_PATHWAYS_CSRC_TRANSPORT_CHANNEL_H_
#define JAX_PATHWAYS_CSRC_TRANSPORT_CHANNEL_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
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
  // controller -> worker on one host: where the controller holds an op's
  // payload tails (u32 count, then a Location each, local_reads.h), then
  // the op frame without them
  kOpLocal = 6,
  // controller -> worker on one host: a Location of kReadProbePattern, to
  // learn whether the worker may read the controller's memory
  kReadProbe = 7,
  kReadProbeAck = 8,  // worker -> controller: u32 1 if it could, else 0
  // worker -> controller, empty, every kHeartbeatInterval: the process still
  // runs (a stopped or wedged one is told from a slow one by its silence)
  kHeartbeat = 9,
};

class Channel {
 public:
  explicit Channel(int fd);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Writes one frame whose body is `head` followed by `body`.
  Status Send(FrameKind kind, std::string_view head, std::string_view body);
  Status Send(FrameKind kind, std::string_view body) {
    return Send(kind, body, {});
  }
  // Writes several frames (head + body + tails each) with as few syscalls
  // as the kernel allows; frames never interleave with other senders'.
  struct Frame {
    FrameKind kind;
    std::string head;
    std::string_view body;
    std::vector<std::string_view> tails = {};
  };
  Status SendMany(const std::vector<Frame>& frames);
  // Reads one whole frame into a fresh buffer.
  Status Receive(FrameKind* kind, Bytes* body);
  // Unblocks a pending Receive() and makes later calls fail.
  void Shutdown();
  // Whether the peer is on this host (a Unix socket).
  bool IsLocal() const;

 private:
  const int fd_;
  std::mutex send_mu_;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_TRANSPORT_CHANNEL_H_
