// Executor: a worker's end of the controller channel.
//
// A reader thread receives Ops without the GIL and files them by sequence
// number; Next() hands them out strictly in gang order, however the frames
// arrived. Whatever runs them (the PJRT backend in Python) reports each one
// with exactly one Complete().
//
// Thread safety: all methods may be called from any thread; Next() and
// Shutdown() block and must be called without the GIL.
#ifndef JAX_PATHWAYS_CSRC_EXECUTOR_EXECUTOR_H_
#define JAX_PATHWAYS_CSRC_EXECUTOR_EXECUTOR_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "common/status.h"
#include "transport/channel.h"
#include "transport/messages.h"

namespace jax_pathways {

class Executor {
 public:
  // Takes ownership of `controller_fd`, connected and authenticated.
  explicit Executor(int controller_fd);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The next op in gang order; nullopt after `timeout_s` without one. Fails
  // once the controller is gone and no received op is left to run.
  StatusOr<std::optional<Op>> Next(double timeout_s);
  Status Complete(uint64_t seq, const Status& status,
                  std::string_view payload);
  // Ops received but not yet handed out (including ones waiting for an
  // earlier sequence number).
  size_t backlog();
  void Shutdown();

 private:
  void ReadLoop();
  // Tells the controller whether its probe's Location could be read.
  Status AnswerProbe(const Bytes& body);
  // An OpLocal frame -> the Op frame it stands for, its tails read from the
  // controller's memory.
  Status ReadLentTails(Bytes* body);

  std::unique_ptr<Channel> channel_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Op> reorder_;
  uint64_t next_seq_ = 1;
  Status closed_;  // why no more ops will come; OK while connected
  std::thread reader_;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_EXECUTOR_EXECUTOR_H_
