// CompletionQueue: where the core hands finished work back to Python.
//
// C++ threads push; one Python thread pops (with the GIL released) and runs
// the callback it filed under `tag`. The core therefore never holds a Python
// reference and never takes the GIL on its own threads.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_COMPLETION_QUEUE_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_COMPLETION_QUEUE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/blocking_queue.h"
#include "common/bytes.h"
#include "common/status.h"

namespace jax_pathways {

struct Completion {
  uint64_t tag = 0;
  Status status;
  // One payload per island of the finished gang, in gang order.
  std::vector<Bytes> payloads;
};

using CompletionQueue = BlockingQueue<Completion>;

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_COMPLETION_QUEUE_H_
