// CompletionQueue: where the core hands finished work back to Python.
//
// C++ threads push; one Python thread pops (with the GIL released) and runs
// the callback it filed under `tag`. The core therefore never holds a Python
// reference and never takes the GIL on its own threads.
#ifndef JAX_PATHWAYS_CSRC_DISPATCHER_COMPLETION_QUEUE_H_
#define JAX_PATHWAYS_CSRC_DISPATCHER_COMPLETION_QUEUE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace jax_pathways {

struct Completion {
  uint64_t tag = 0;
  Status status;
  // One payload per island of the finished gang, in gang order.
  std::vector<std::string> payloads;
};

class CompletionQueue {
 public:
  void Push(Completion c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      items_.push_back(std::move(c));
    }
    cv_.notify_one();
  }

  // Waits up to `timeout_s` for at least one completion; returns at most
  // `max_items`. Returns empty on timeout or after Close().
  std::vector<Completion> Pop(double timeout_s, size_t max_items) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                 [&] { return !items_.empty() || closed_; });
    std::vector<Completion> out;
    while (!items_.empty() && out.size() < max_items) {
      out.push_back(std::move(items_.front()));
      items_.pop_front();
    }
    return out;
  }

  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Completion> items_;
  bool closed_ = false;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_DISPATCHER_COMPLETION_QUEUE_H_
