// BlockingQueue: many producers, one consumer that takes items in batches.
//
// The way C++ threads hand work to a Python thread: the consumer waits with
// the GIL released and gets everything that has piled up, so a busy stream
// costs one wake-up per batch rather than one per item.
#ifndef JAX_PATHWAYS_CSRC_COMMON_BLOCKING_QUEUE_H_
#define JAX_PATHWAYS_CSRC_COMMON_BLOCKING_QUEUE_H_

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

namespace jax_pathways {

template <typename T>
class BlockingQueue {
 public:
  void Push(T item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
  }

  // Waits up to `timeout_s` for at least one item; returns at most
  // `max_items`. Returns empty on timeout or once closed and drained.
  std::vector<T> Pop(double timeout_s, size_t max_items) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                 [&] { return !items_.empty() || closed_; });
    std::vector<T> out;
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
  std::deque<T> items_;
  bool closed_ = false;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_COMMON_BLOCKING_QUEUE_H_
