// GangOrder: one total order of ops per island.
//
// Every op gets the next sequence number of each island it runs on. The
// Dispatcher assigns all of a gang's numbers under one lock, so any two gangs
// that share islands are ordered the same way on every island they share:
// programs that communicate can never wait on each other in a cycle, and
// collectives of different programs can never pair up wrongly. Workers run
// ops strictly by these numbers. Not thread-safe: the Dispatcher's mutex
// guards it.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_GANG_ORDER_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_GANG_ORDER_H_

#include <cstdint>
#include <unordered_map>

#include "transport/messages.h"

namespace jax_pathways {

class GangOrder {
 public:
  // Sequence numbers start at 1 on every island; 0 means "none".
  uint64_t Next(IslandId island) { return ++last_[island]; }
  // A new worker took the island's place: its numbers start at 1 again.
  void Restart(IslandId island) { last_.erase(island); }
  uint64_t Last(IslandId island) const {
    auto it = last_.find(island);
    return it == last_.end() ? 0 : it->second;
  }

 private:
  std::unordered_map<IslandId, uint64_t> last_;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_GANG_ORDER_H_
