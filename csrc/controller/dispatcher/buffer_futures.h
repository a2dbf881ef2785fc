// BufferFutures: every buffer the controller knows of, as a future.
//
// A buffer is pending from the moment the op producing it is submitted (long
// before any worker has it), then ready or failed with the producer's Status.
// Waiters registered with WhenReady() complete once all their buffers are
// ready, or at the first failure. Not thread-safe: the Dispatcher's mutex
// guards it.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_BUFFER_FUTURES_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_BUFFER_FUTURES_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "controller/dispatcher/completion_queue.h"
#include "transport/messages.h"

namespace jax_pathways {

enum class BufferState { kPending, kReady, kFailed };

class BufferFutures {
 public:
  void AddPending(const std::vector<BufferId>& ids);
  // Settles `ids` with `status`; waiters that finish are appended to `out`.
  // A failed buffer stays failed.
  void Resolve(const std::vector<BufferId>& ids, const Status& status,
               std::vector<Completion>* out);
  // Files a waiter; appends its completion to `out` at once if it is already
  // decided (all ready, one failed, or an id that was never produced).
  void WhenReady(const std::vector<BufferId>& ids, uint64_t tag,
                 std::vector<Completion>* out);
  // First failure among `ids`, or OK. Pending and unknown ids count as OK.
  Status FirstFailure(const std::vector<BufferId>& ids) const;
  // Drops `ids`; their unfinished waiters fail (appended to `out`): a
  // request waiting for an array the client then deleted still gets its
  // answer. One a held gang needs (Hold) stays until released.
  void Forget(const std::vector<BufferId>& ids, std::vector<Completion>* out);
  // Keeps `ids` known, once forgotten too, until released: a gang waiting
  // for its turn that names them must read how they end (a gang refused
  // before it fails its results, which a launch's temporaries, forgotten
  // once submitted, would otherwise hide from it). Unknown ids (forgotten
  // already; ids are never reused) are skipped, here and by Release().
  void Hold(const std::vector<BufferId>& ids);
  void Release(const std::vector<BufferId>& ids);

  BufferState State(BufferId id, Status* failure) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Waiter {
    uint64_t tag;
    size_t remaining;
    bool done = false;
  };
  struct Entry {
    BufferState state = BufferState::kPending;
    Status failure;
    std::vector<std::shared_ptr<Waiter>> waiters;
    int holds = 0;           // gangs waiting that name it (Hold)
    bool forgotten = false;  // dropped once no gang holds it
  };
  std::unordered_map<BufferId, Entry> entries_;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_BUFFER_FUTURES_H_
