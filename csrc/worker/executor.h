// Executor: a worker's end of the controller channel.
//
// A reader thread receives Ops without the GIL and files them by sequence
// number; Next() hands them out strictly in gang order, however the frames
// arrived. Whatever runs them (the PJRT backend in Python) reports each one
// with exactly one Complete(). A heartbeat thread tells the controller every
// kHeartbeatInterval that the process still runs, and watches the controller
// in turn: one that sent nothing (not even its own heartbeat) for the
// controller timeout is lost (stopped, wedged or cut off), and Next() then
// fails as if the connection had dropped, so the worker exits.
//
// Thread safety: all methods may be called from any thread; Next() and
// Shutdown() block and must be called without the GIL.
#ifndef JAX_PATHWAYS_CSRC_WORKER_EXECUTOR_H_
#define JAX_PATHWAYS_CSRC_WORKER_EXECUTOR_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "transport/channel.h"
#include "transport/local_reads.h"
#include "transport/messages.h"

namespace jax_pathways {

class Executor {
 public:
  // Takes ownership of `controller_fd`, connected and authenticated.
  // `controller` names it in errors. `controller_timeout_s`: seconds without
  // a frame from the controller after which it is lost (0: never).
  explicit Executor(int controller_fd, std::string controller = "",
                    double controller_timeout_s = 0);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The next ops in gang order, at most `max_ops` (>= 1), as many as have
  // arrived: one wake-up for a burst (PEER_LOST notices go before any op);
  // none after `timeout_s` without one. Fails once the controller is gone
  // and no received op is left to run.
  StatusOr<std::vector<Op>> Next(double timeout_s, size_t max_ops);
  // `device_ns`: how long a launch held the island (Event::device_ns).
  Status Complete(uint64_t seq, const Status& status,
                  std::string_view payload, uint64_t device_ns = 0);
  // The same for a payload of at most kSmallEvent bytes, copied: never
  // waits (what the socket does not take now, the channel's writer sends),
  // so a caller may hold the GIL through it.
  Status CompleteSmall(uint64_t seq, const Status& status,
                       std::string_view payload, uint64_t device_ns = 0);
  static constexpr size_t kSmallEvent = size_t{64} << 10;
  // Ops received but not yet handed out (including ones waiting for an
  // earlier sequence number).
  size_t backlog();
  // A loss (PEER_LOST) that has arrived but is not handed out yet: an op
  // waiting for a global client being built with the island, or for bytes
  // from its lost worker, gives up instead of waiting for it.
  struct Loss {
    uint64_t island = 0;
    uint64_t upto = 0;  // the notice's seq: see OpKind::kPeerLost
    std::string why;
  };
  std::vector<Loss> PendingLosses();
  // Why no more ops will come (the controller is gone or silent); OK while
  // connected. Does not wait.
  Status closed();
  // PUTs that took their staged upload (FrameKind::kStage, kStageData),
  // and those that named a stage but read their tails instead (it was not
  // whole).
  uint64_t staged_puts() const { return staged_puts_; }
  uint64_t unstaged_puts() const { return unstaged_puts_; }
  void Shutdown();

 private:
  void ReadLoop();
  void HeartbeatLoop();
  // Tells the controller whether its probe's Location could be read.
  Status AnswerProbe(const Bytes& body);
  // An OpLocal frame -> the Op frame it stands for, its tails taken from
  // their stage or read from the controller's memory.
  Status ReadLentTails(Bytes* body);
  // Stage frames: copies an upload's next pieces into its stage, or drops
  // the stage (a part out of order, no room); never fails the connection
  // but for a malformed frame.
  Status StagePart(std::string_view frame);
  void DropStage(uint64_t stage);
  // The op frame `frame` with the staged bytes behind it, if stage `id`
  // holds exactly `tails`; else an empty Bytes. Drops the stage.
  Bytes TakeStage(uint64_t id, std::string_view frame,
                  const std::vector<Location>& tails);
  // kStageData: where the upload's next `n` bytes go in their stage, given
  // the frame's head (`head`: stage, total, offset). Unlike a stage read
  // from the controller's memory, one sent is never refused, dropped or out
  // of order but by a broken controller (the PUT has no bytes of its own):
  // that fails the connection.
  StatusOr<char*> StageSpace(std::string_view head, size_t n);
  // A kOpStaged frame -> the op frame with its stage's bytes behind it.
  Status TakeSentStage(Bytes* body);

  std::unique_ptr<Channel> channel_;
  const std::string controller_;
  const std::chrono::duration<double> controller_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;  // an op or notice to hand out, or closed
  // The heartbeat thread's own: told only of stopping or closing. Sharing
  // cv_ woke it (for nothing) at every op.
  std::condition_variable heartbeat_cv_;
  std::map<uint64_t, Op> reorder_;
  std::deque<Op> notices_;  // PEER_LOST, not numbered
  bool stopping_ = false;   // ends the heartbeat thread
  uint64_t next_seq_ = 1;
  Status closed_;  // why no more ops will come; OK while connected
  // When the controller last sent a frame (or, before any, when we started).
  std::chrono::steady_clock::time_point last_heard_;
  // Uploads staged as they arrive, by stage id (the reader thread's only).
  struct Staged {
    Bytes buffer;  // kStagePrefix bytes for the op frame, then the upload
    char* base = nullptr;
    uint64_t total = 0;
    uint64_t filled = 0;
    // What was copied, by offset: each upload's parts in order, several
    // uploads (an array's shards) interleaved.
    std::map<uint64_t, std::vector<Location>> read;
    bool sent = false;           // the bytes came in kStageData frames
  };
  // A new stage `id` with room for `total` bytes (and the prefix).
  StatusOr<Staged*> OpenStage(uint64_t id, uint64_t total, bool sent);
  // Stage `id`, no longer held (none if unknown).
  std::optional<Staged> CloseStage(uint64_t id);
  // `frame` copied into the room before the stage's upload, and the two as
  // one payload (64-byte aligned); empty if it does not fit.
  static Bytes BehindFrame(Staged& stage, std::string_view frame);
  std::map<uint64_t, Staged> stages_;
  uint64_t staged_bytes_ = 0;
  std::atomic<uint64_t> staged_puts_{0};
  std::atomic<uint64_t> unstaged_puts_{0};
  std::thread reader_;
  std::thread heartbeat_;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_WORKER_EXECUTOR_H_
