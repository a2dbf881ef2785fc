// Dispatcher: the controller's hot path from "launch this" to the workers.
//
// Submit() registers the gang's results as pending buffers and returns at
// once. The gang waits in FairShare, behind its client's earlier gangs, until
// every island it launches on has room in its in-flight window and its client
// is the least served of those that fit; then every op gets its place in each
// island's gang order and goes to the worker before its inputs exist (workers
// run ops in order, so an op's inputs are always produced by earlier ops). One reader thread per island turns
// Events into buffer states and Completions. A lost worker (its connection
// dropped, or silent past the worker timeout) fails with DATA_LOSS the
// buffers it held, every gang it was part of (on every island, at once) and
// everything later sent to it; the other islands are told (PEER_LOST), so
// that their part of programs spanning it fails instead of waiting. A
// heartbeat thread tells every live worker each kHeartbeatInterval that the
// controller still runs (a worker whose controller falls silent exits);
// it only queues, so a worker that does not read never holds it up.
//
// Its methods live by idea: dispatcher.cc (submitting, sending, reading
// what workers report), admission.cc (fair share and the memory budget),
// stages.cc (uploads forwarded as they arrive) and island_loss.cc
// (heartbeats, silent and lost islands, failures held for a loss).
//
// Thread safety: every public method may be called from any thread. Blocking
// methods (Poll, Shutdown) must be called without the GIL.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_DISPATCHER_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_DISPATCHER_H_

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/status.h"
#include "controller/dispatcher/buffer_futures.h"
#include "controller/dispatcher/completion_queue.h"
#include "controller/dispatcher/fair_share.h"
#include "controller/dispatcher/gang_order.h"
#include "controller/dispatcher/launch_queue.h"
#include "controller/dispatcher/stages.h"
#include "transport/channel.h"
#include "transport/messages.h"

namespace jax_pathways {

struct IslandOp {
  IslandId island = 0;
  Op op;  // `seq` is assigned by the Dispatcher
  // Device memory each of op.results takes on this island (empty: none).
  std::vector<int64_t> result_bytes;
  // A buffer the op needs but does not take (a receive's source, sent by
  // another op): failed by the time the op is numbered, it fails the op
  // too, which would wait for bytes that never come. 0: none.
  BufferId fails_with = 0;
};

struct IslandStats {
  IslandId island = 0;
  std::string name;
  bool alive = true;
  std::string error;
  // Workers that took the island's place after it was lost (its generation).
  int restarts = 0;
  // Why and when (seconds since the epoch) the island was last lost; kept
  // across restarts. Empty / 0: never.
  std::string last_lost;
  double last_lost_at = 0;
  size_t queued = 0;     // held back by the window
  int in_flight = 0;     // launches sent, not finished
  size_t unfinished = 0; // all ops sent, not finished
  uint64_t submitted = 0;
  uint64_t finished = 0;
  int64_t memory_used = 0;      // by arrays numbered and not yet deleted
  int64_t memory_capacity = 0;  // 0: not tracked
  bool reads_locally = false;   // uploads are lent, not sent (same host)
  size_t lent = 0;              // lent uploads the worker has not finished
  uint64_t staged_bytes = 0;    // of uploads forwarded as they arrived
  // Room a worker elsewhere holds now for stages sent to it, until their
  // PUT or their end (kUnstage); kMaxSentStageBytes at most.
  uint64_t held_stage_bytes = 0;
  // Bytes sent to the worker that its socket has not taken yet: large and
  // not shrinking while the worker does not read.
  size_t send_backlog_bytes = 0;
  // The launch the island runs now (its oldest unfinished one): its client
  // (0: none), program, and seconds since it was sent or the launch before
  // it finished, whichever is later (controller/run_bounds.py).
  ClientId running_client = 0;
  uint64_t running_program = 0;
  double running_s = 0;
  // Ops of others waiting behind it on the island (other clients', the
  // controller's compiles).
  size_t others_waiting = 0;
};

class Dispatcher {
 public:
  explicit Dispatcher(int max_in_flight);
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Takes ownership of `fd`, a connected and authenticated worker socket.
  // `memory_bytes`: the island's device memory (0: unlimited); gangs whose
  // results would not fit wait until deletions make room. An island that was
  // lost may be added again (a new worker, its next generation): the new
  // worker starts a gang order of its own, nothing sent to the old one
  // reaches it, and the old one's buffers stay failed.
  Status AddIsland(IslandId island, int fd, std::string name,
                   int64_t memory_bytes = 0);
  // Enqueues every op of the gang atomically (see GangOrder). Completes under
  // `tag` (0: no completion wanted) once every op finished, with the first
  // error if any. Fails at once, sending nothing, if an island is unknown or
  // dead or an argument buffer already failed.
  void Submit(std::vector<IslandOp> gang, uint64_t tag, ClientId client = 0);
  // The same, calling `done` with the completion (its status and payloads)
  // instead (C++ callers), on the thread that finishes the gang, never under
  // a lock of the Dispatcher's.
  void Submit(std::vector<IslandOp> gang,
              std::function<void(Completion)> done, ClientId client = 0);
  // A client's share of saturated islands, relative to the others' weights.
  void SetWeight(ClientId client, double weight);
  // The client is gone: drops its bookkeeping once its work has finished.
  void ForgetClient(ClientId client);
  std::vector<ClientShare> Shares();
  // Fails gangs that have waited longer than `max_wait_s` for device memory
  // other clients hold (called periodically): a wait is never endless.
  void ExpireMemoryWaits(double max_wait_s);
  // Completes under `tag` when all `ids` are ready, or at the first failure.
  void WhenReady(const std::vector<BufferId>& ids, uint64_t tag);
  // The same, calling `done` instead (C++ callers: controller/fast_path/fast_path.h), on
  // whichever thread decides it, this one included, never under a lock of
  // the Dispatcher's.
  void WhenReady(const std::vector<BufferId>& ids,
                 std::function<void(const Status&)> done);
  // `n` fresh buffer ids, never used before (one counter for every caller).
  std::vector<BufferId> NewBuffers(size_t n);
  // `n` fresh transfer ids for moves between islands (an op's `program`):
  // 38 random bits, bit 38 set, above a 20-bit piece index, so no transfer
  // of anyone else's can collide with, or guess, one.
  std::vector<uint64_t> NewTransfers(size_t n);
  // Changes whenever an island is lost or a worker takes a lost island's
  // place: what was compiled or placed for the islands before may need
  // redoing (Python's CompiledProgram.ensure_current).
  uint64_t epoch() const { return epoch_.load(); }
  BufferState State(BufferId id, Status* failure);
  void Forget(const std::vector<BufferId>& ids);
  // Fails the island as if its connection had dropped.
  void FailIsland(IslandId island, const Status& why);
  // A lost island's error from now on ends with `note` (what became of it
  // since: its supervisor gave up restarting it, say). No-op if alive.
  void NoteLoss(IslandId island, const std::string& note);
  // Fails islands that sent nothing (not even a heartbeat) for `timeout_s`
  // since their last frame or their handshake: a stopped or wedged worker
  // (called periodically).
  void ExpireSilentIslands(double timeout_s);

  // Uploads staged as they arrive (controller/dispatcher/stages.h): a fresh stage id,
  // a stream that forwards an upload's pieces into the stage on the workers
  // of `dests` (where they are, to one on this host; the bytes, kept alive
  // by `owner` until written, to one elsewhere), and the end of a stage no
  // PUT will take (a PUT naming it, Op::stage, ends it too). Never block.
  uint64_t NewStage() { return next_stage_++; }
  JpUploadStream StreamUpload(uint64_t stage, std::vector<StageDest> dests);
  void Stage(uint64_t stage, const std::vector<StageDest>& dests,
             uint64_t offset, const std::vector<std::string_view>& pieces,
             std::shared_ptr<const void> owner);
  void Unstage(const std::vector<IslandId>& islands, uint64_t stage);

  // While corked, ops are held and then sent together at the last Uncork():
  // a burst of requests becomes one write per island instead of one per op
  // (and one wake-up of the worker). Cork/Uncork nest.
  void Cork();
  void Uncork();

  std::vector<Completion> Poll(double timeout_s, size_t max_items);
  std::vector<IslandStats> Stats();
  size_t live_buffers();
  // Closes every channel and joins the reader threads. Idempotent.
  void Shutdown();

 private:
  struct Island {
    IslandId id;
    std::string name;
    std::shared_ptr<Channel> channel;
    LaunchQueue queue;
    bool alive = true;
    Status death;
    int restarts = 0;
    std::string last_lost;  // of this island id, kept across restarts
    double last_lost_at = 0;
    uint64_t submitted = 0;
    uint64_t finished = 0;
    std::chrono::steady_clock::time_point last_finish;  // of a launch
    // Any frame, or the handshake: a worker heartbeats from its handshake
    // on (also while it joins the islands' global client), so one stopped
    // right after it joined is lost like any other.
    std::chrono::steady_clock::time_point last_heard =
        std::chrono::steady_clock::now();
    // Device memory, counted in gang order: results when numbered, freed
    // when their DELETE is numbered (the worker runs both in that order).
    int64_t capacity = 0;
    int64_t used = 0;
    std::unordered_map<BufferId, std::pair<ClientId, int64_t>> held;
    // Every buffer numbered to be made here and not deleted, views (which
    // take no memory of their own) too: what a loss fails.
    std::unordered_set<BufferId> made;
    std::map<ClientId, int64_t> used_by;
    // The worker shares this host and may read our memory (it answered the
    // probe AddIsland sent): large payload tails are lent, not sent.
    bool reads_locally = false;
    // Lent tails, by op seq, kept alive until the op finishes.
    std::unordered_map<uint64_t, std::vector<Bytes>> lent;
    uint64_t staged_bytes = 0;
    // Stages whose bytes went to this worker (it is on another host), by
    // id: at most kMaxStages of kMaxSentStageBytes in all, as the worker
    // holds no more.
    struct SentStage {
      uint64_t total = 0;
      uint64_t sent = 0;
      // What went where: each upload's pieces in order, several uploads
      // (an array's shards) interleaved.
      std::map<uint64_t, std::string_view> pieces;
      // Whether the worker holds exactly `tails`, all of the stage.
      bool Holds(const std::vector<Bytes>& tails) const;
    };
    std::unordered_map<uint64_t, SentStage> sent_stages;
    uint64_t sent_stage_bytes = 0;  // their totals
    // Stages refused for want of room: none of their later parts goes
    // (the worker would hold them for nothing: their PUT sends its bytes).
    std::unordered_set<uint64_t> refused_stages;
    void EndSentStage(uint64_t stage);
    std::thread reader;

    Island(IslandId i, std::string n, std::shared_ptr<Channel> c, int window,
           int64_t memory)
        : id(i), name(std::move(n)), channel(std::move(c)), queue(window),
          capacity(memory) {}
  };
  struct Outgoing {
    enum class Tails {
      kSend,    // op.payload_tails' bytes, after the op
      kLend,    // where they are (the worker reads our memory)
      kStaged,  // nothing: the worker holds them in op.stage already
    };
    std::shared_ptr<Channel> channel;
    Op op;
    Tails tails = Tails::kSend;
  };
  using Outbox = std::vector<Outgoing>;
  // A gang that passed Submit's checks and waits for its turn.
  struct Held {
    std::shared_ptr<Gang> gang;
    std::vector<IslandOp> ops;
    std::chrono::steady_clock::time_point since;  // submitted
    // Its ops' inputs (args, fails_with), kept known while it waits
    // (BufferFutures::Hold), even when forgotten meanwhile; filled only if
    // Submit could not number it at once.
    std::vector<BufferId> inputs;
  };
  // A gang held failed (held_failures_).
  struct HeldFailure {
    std::shared_ptr<Gang> gang;
    std::chrono::steady_clock::time_point until;
  };

  void ReadLoop(Island* island);
  // Requires mu_. Moves ops the window admitted to the outbox; ops that
  // expect no event are finished as they are sent.
  void Admitted(Island* island, std::vector<Op> ready, Outbox* outbox,
                std::vector<Completion>* done);
  void HandleEvent(Island* island, Event event);
  // Requires mu_. Records that one op of `slot`'s gang finished; a gang
  // whose only failure is a broken link (kBrokenLinkWords) is held, for
  // kLossNoticeWait at most, while it awaits its cause (AwaitsCause).
  void FinishSlot(const GangSlot& slot, const Status& status,
                  Bytes payload, std::vector<Completion>* done);
  // Requires mu_. Whether `g`, failed by a broken link, still awaits the
  // failure behind it: an input still pending (its producer may be held
  // for its own broken link: a worker passes that failure on to the ops
  // after it), or, spanning islands, the loss of one. If not, `cause` is
  // what it fails with: an input's failure, else its own.
  bool AwaitsCause(const Gang& g, Status* cause) const;
  // Requires mu_. Finishes a gang all of whose ops have reported.
  void Finish(Gang& g, std::vector<Completion>* done);
  // Requires mu_. Finishes the held gangs that spanned `island`, lost:
  // they failed for `why`, whose words name its worker.
  void EndHeldOn(const Island& island, const Status& why,
                 std::vector<Completion>* done);
  // Requires mu_. Finishes the held gangs past their time, with their own
  // failure: no loss came.
  void EndHeldExpired(std::vector<Completion>* done);
  // Requires mu_. Finishes the held gangs whose inputs settled their cause.
  void EndHeldByInputs(std::vector<Completion>* done);
  // Requires mu_. Finishes `h`, taken from held_failures_.
  void EndHeld(HeldFailure& h, std::vector<Completion>* done);
  // Requires mu_. Takes the held gangs `which` picks out of held_failures_.
  std::vector<HeldFailure> TakeHeld(
      const std::function<bool(const HeldFailure&)>& which);
  // Requires mu_. Numbers and sends the held gangs whose turn it is; fails
  // those that only their own client could make room for.
  void AdmitHeld(Outbox* outbox, std::vector<Completion>* done);
  // Requires mu_. The failure of an input of `io` (its args, fails_with), or
  // OK; never for a DELETE.
  Status InputFailure(const IslandOp& io) const;
  bool Fits(const Held& held) const;
  // The island whose memory `held` does not fit in, or nullptr.
  const Island* ShortOfMemory(const Held& held) const;
  // The reason `held` can never get the memory it needs while `client`'s
  // later gangs wait behind it, or OK.
  Status Hopeless(ClientId client, const Held& held) const;
  // Why `io`'s results can never fit in `island`'s memory, or OK.
  Status NeverFits(const IslandOp& io, const Island& island) const;
  // Requires mu_. Counts the memory of an op being numbered.
  void CountMemory(Island* island, ClientId client, const IslandOp& io);
  // Requires mu_. Fails a gang that will not be numbered.
  void Refuse(const Held& held, const Status& why,
              std::vector<Completion>* done);
  // Requires mu_. Marks `island` dead, fails everything it held and every
  // gang it was part of, and tells the other islands.
  void KillLocked(Island* island, const Status& why, Outbox* outbox,
                  std::vector<Completion>* done);
  // Sends `outbox` and publishes `done`; called without mu_.
  void Flush(Outbox outbox, std::vector<Completion> done);
  // A tag under which `done` is called instead of queueing the completion.
  uint64_t NativeTag(std::function<void(Completion)> done);

  void SendNow(Outbox outbox);
  // Hands completions to Python, or to the C++ callbacks filed under them.
  void Publish(std::vector<Completion> done);
  void HeartbeatLoop();

  const int max_in_flight_;
  std::mutex cork_mu_;  // guards corks_ and held_ (never taken with mu_)
  int corks_ = 0;
  Outbox held_;
  std::mutex mu_;
  std::map<IslandId, std::unique_ptr<Island>> islands_;
  GangOrder order_;
  FairShare<Held> fair_;
  BufferFutures buffers_;
  CompletionQueue completions_;
  std::mutex native_mu_;  // guards native_ (never taken with mu_)
  uint64_t next_native_ = 0;
  std::unordered_map<uint64_t, std::function<void(Completion)>> native_;
  std::atomic<BufferId> next_buffer_{1};
  std::mutex random_mu_;  // guards random_ (nothing is taken under it)
  std::random_device random_;
  std::atomic<uint64_t> next_stage_{1};
  const std::shared_ptr<StageSink> stage_sink_ =
      std::make_shared<StageSink>(this);
  std::atomic<uint64_t> epoch_{0};
  // Gangs spanning islands whose ops all reported, failed only by a broken
  // link between workers: one of them was likely lost, and its loss, which
  // names the worker, may not be known yet (a killed worker's peers see
  // their link break while the controller still reads what it sent before
  // it died); and gangs that failed because such a gang's results did.
  // Held until an island of theirs is lost, their inputs settle, or
  // `until`.
  std::vector<HeldFailure> held_failures_;
  bool shut_down_ = false;
  std::condition_variable shutting_down_;  // with mu_: wakes the heartbeat
  std::thread heartbeat_;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_DISPATCHER_H_
