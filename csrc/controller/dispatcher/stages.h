// Stages: an upload forwarded, while it still arrives, to the workers that
// will put it, so that their part overlaps the client's sending instead of
// following it. A worker on this host is told where the pieces are
// (FrameKind::kStage) and copies them out of the controller's memory as
// they come; its PUT names the stage and takes what is there, or reads its
// tails itself if the stage is not whole (a piece forwarded late, a worker
// short of memory). A worker on another host is sent the bytes
// (kStageData); its PUT goes without them (kOpStaged) only if the whole
// upload, these very pieces, went to it, else with them as before.
//
// The frontend (module _server) forwards pieces on its gRPC thread
// through a JpUploadStream (common/request_hook.h) made here; it may
// outlive the Dispatcher, and then forwards nothing.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_STAGES_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_STAGES_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "common/request_hook.h"
#include "transport/messages.h"

namespace jax_pathways {

class Dispatcher;

// Where an upload goes in a stage of `total` bytes on `island`'s worker:
// from `base` on. A PUT's stage holds its payload's tails, which may be
// several uploads (the shards of an array that land on the island), each
// streamed on its own and arriving interleaved with the others.
struct StageDest {
  IslandId island;
  uint64_t total;
  uint64_t base;
};

// The Dispatcher as upload streams reach it.
class StageSink {
 public:
  explicit StageSink(Dispatcher* dispatcher) : dispatcher_(dispatcher) {}
  // `owner` keeps the pieces alive.
  void Forward(uint64_t stage, const std::vector<StageDest>& dests,
               uint64_t offset, const std::vector<std::string_view>& pieces,
               std::shared_ptr<const void> owner);
  // The Dispatcher is going: later calls do nothing.
  void Detach();

 private:
  std::mutex mu_;  // held while forwarding, so Detach() waits for it
  Dispatcher* dispatcher_;
};

// A stream of one upload into `stage` at `dests`; the caller holds one
// reference to its target (release() it).
JpUploadStream MakeUploadStream(std::shared_ptr<StageSink> sink,
                                uint64_t stage, std::vector<StageDest> dests);

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_STAGES_H_
