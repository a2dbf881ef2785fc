// HostBuffers: bytes on their way between a client and its arrays.
//
// Uploads (HostBufferStore) are assembled here by the gRPC thread and taken
// by the request that consumes them; downloads are stored here before the
// CopyToHostBuffer reply, because the client looks them up only after that
// reply and the lookup does not wait. Buffers live per session; a session's
// buffers go when it ends. Buffers are Bytes (shared storage), so a lookup
// can stream one while the client deletes it, and an upload can go on to a
// worker without a copy.
//
// Thread safety: all methods may be called from any thread; Take() blocks
// and must be called without the GIL.
#ifndef JAX_PATHWAYS_CSRC_FRONTEND_HOST_BUFFERS_H_
#define JAX_PATHWAYS_CSRC_FRONTEND_HOST_BUFFERS_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include "common/bytes.h"
#include "common/status.h"

namespace jax_pathways {

using HostBuffer = Bytes;

class HostBuffers {
 public:
  void OpenSession(uint64_t session);
  void CloseSession(uint64_t session);
  bool HasSession(uint64_t session);

  Status Store(uint64_t session, uint64_t handle, HostBuffer data);
  StatusOr<HostBuffer> Lookup(uint64_t session, uint64_t handle);
  // Waits up to `timeout_s` for an upload, then removes and returns it.
  StatusOr<HostBuffer> Take(uint64_t session, uint64_t handle,
                            double timeout_s);
  Status Delete(uint64_t session, uint64_t handle);
  size_t total_bytes();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::map<uint64_t, HostBuffer>> sessions_;
  size_t bytes_ = 0;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_FRONTEND_HOST_BUFFERS_H_
