// LaunchQueue: one island's ops between submission and completion.
//
// Ops enter in gang order. They are released to the wire in that order for as
// long as the in-flight window admits the next launch; the first launch that
// does not fit holds back everything behind it (an op behind it may depend on
// it). Sent ops are remembered by sequence number until their Event arrives.
// Not thread-safe: the Dispatcher's mutex guards it.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_LAUNCH_QUEUE_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_LAUNCH_QUEUE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "controller/dispatcher/fair_share.h"
#include "controller/dispatcher/in_flight_window.h"
#include "transport/messages.h"

namespace jax_pathways {

// The ops of one Submit() call, which finish together, or at once when one
// of their islands is lost (`done`: the rest need not finish).
struct Gang {
  uint64_t tag = 0;
  size_t remaining = 0;
  bool done = false;
  Status status;
  std::vector<Bytes> payloads;  // per island, in gang order
  std::vector<BufferId> results;      // of every island's op
  std::vector<IslandId> islands;      // one per op, in gang order
  // Every op's args and fails_with: where a broken link the gang reports
  // may have come from (Dispatcher::AwaitsCause).
  std::vector<BufferId> inputs;
};

// Where an op's Event goes, and whose launch it was.
struct GangSlot {
  std::shared_ptr<Gang> gang;
  size_t index = 0;
  bool is_launch = false;
  ClientId client = 0;
  double estimate = 0;  // seconds charged when it was numbered
  std::chrono::steady_clock::time_point sent;
  uint64_t program = 0;  // a launch's
};

class LaunchQueue {
 public:
  explicit LaunchQueue(int max_in_flight) : window_(max_in_flight) {}

  // Appends `op` (already numbered); ops the window now admits go to
  // `to_send`, in order.
  void Push(Op op, GangSlot slot, std::vector<Op>* to_send);
  // Ends op `seq`; admits what the freed window allows. Empty if `seq` was
  // never sent (a confused worker).
  std::optional<GangSlot> Finish(uint64_t seq, std::vector<Op>* to_send);
  // Empties the queue (the island is gone); returns every unfinished slot.
  std::vector<GangSlot> DrainAll();

  size_t queued() const { return waiting_.size(); }
  // Whether a launch numbered now would be sent at once.
  bool HasRoom() const { return waiting_.empty() && window_.HasRoom(); }
  int in_flight() const { return window_.in_flight(); }
  size_t sent_unfinished() const { return sent_.size(); }
  // The sent launch numbered first that has not finished (the one the
  // island runs, as workers run launches in order); null: none.
  const GangSlot* OldestLaunch() const;
  // Ops of others than `client` (other clients', the controller's own
  // compiles), sent or held back.
  size_t OpsOfOthers(ClientId client) const;

 private:
  void Admit(std::vector<Op>* to_send);

  InFlightWindow window_;
  std::deque<std::pair<Op, GangSlot>> waiting_;
  std::unordered_map<uint64_t, GangSlot> sent_;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_LAUNCH_QUEUE_H_
