// HostBuffers: bytes on their way between a client and its arrays.
//
// Uploads (HostBufferStore) are assembled here by the gRPC thread and taken
// by the request that consumes them; downloads are stored here before the
// CopyToHostBuffer reply, because the client looks them up only after that
// reply and the lookup does not wait. Buffers live per session; a session's
// buffers go when it ends. Buffers are Bytes (shared storage), so a lookup
// can stream one while the client deletes it, and an upload can go on to a
// worker without a copy. An upload stays in the pieces it arrived in
// (gRPC's own receive slices, referenced rather than copied): the worker
// reads or is sent them in order, so they land as one contiguous array
// there.
//
// A request that needs an upload which has not arrived yet does not wait
// here: TakeOrWatch() notes the wait and the waker runs when the upload is
// stored, so the caller (one thread serving every session) never blocks;
// the fast path's request waits the same way (WatchStore, on the frontend's
// behalf: its wake offers the request again).
// Meanwhile the upload may stream: the pieces the gRPC thread receives go
// on to a JpUploadStream (the dispatcher's: staged on the workers that
// will put them) as they come, so the workers' copy overlaps the client's
// sending.
//
// Thread safety: all methods may be called from any thread; none blocks.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_HOST_BUFFERS_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_HOST_BUFFERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "common/request_hook.h"
#include "common/status.h"

namespace jax_pathways {

// A host buffer's bytes, in order (a download: one piece).
using HostBuffer = std::vector<Bytes>;
size_t SizeOf(const HostBuffer& buffer);

class HostBuffers {
 public:
  void OpenSession(uint64_t session);
  void CloseSession(uint64_t session);
  bool HasSession(uint64_t session);

  Status Store(uint64_t session, uint64_t handle, HostBuffer data);
  StatusOr<HostBuffer> Lookup(uint64_t session, uint64_t handle);
  // Removes and returns the upload if it has arrived; otherwise returns
  // nullopt and calls the waker once it is stored (or its session ends).
  // Then `stream`, if given and the upload has none yet, gets its pieces
  // as they arrive (from the first, with the next chunk) until it is
  // stored or Unstream(); TakeOrWatch holds a reference to its target.
  StatusOr<std::optional<HostBuffer>> TakeOrWatch(
      uint64_t session, uint64_t handle,
      const JpUploadStream* stream = nullptr);
  // The gRPC thread has received `upload` so far of (session, handle): its
  // stream, if any, gets the pieces after the first `*pieces_sent` (which
  // hold `*bytes_sent` bytes), and both counts move on.
  void Arrived(uint64_t session, uint64_t handle, const HostBuffer& upload,
               size_t* pieces_sent, uint64_t* bytes_sent);
  // No more of the upload goes to its stream.
  void Unstream(uint64_t session, uint64_t handle);
  // Called without the lock, from the thread that stored a watched upload.
  void set_waker(std::function<void()> waker);
  // Calls `wake` once, when upload (session, handle) is stored or the
  // session ends (without the lock, from the thread that did), and returns
  // true; returns false, never calling it, if the upload is here already or
  // the session is unknown.
  bool WatchStore(uint64_t session, uint64_t handle,
                  std::function<void()> wake);
  // Removes and returns uploads `handles` of `session` if every one has
  // arrived holding sizes[i] bytes and none is named twice; otherwise
  // nullopt, leaving everything as it was (no watch), with *missing the
  // index of the last one not arrived yet, or handles.size() if none is.
  std::optional<std::vector<HostBuffer>> TakeAllIfSizes(
      uint64_t session, const std::vector<uint64_t>& handles,
      const std::vector<size_t>& sizes, size_t* missing);
  Status Delete(uint64_t session, uint64_t handle);
  size_t total_bytes();

 private:
  // Require mu_.
  void EraseStreams(uint64_t session, uint64_t first, uint64_t last);
  // The WatchStore() wakes of handles [first, last] of `session`, removed.
  std::vector<std::function<void()>> TakeWakes(uint64_t session,
                                               uint64_t first, uint64_t last);

  std::mutex mu_;
  std::map<uint64_t, std::map<uint64_t, HostBuffer>> sessions_;
  std::set<std::pair<uint64_t, uint64_t>> watched_;  // (session, handle)
  std::multimap<std::pair<uint64_t, uint64_t>, std::function<void()>>
      store_watches_;
  std::map<std::pair<uint64_t, uint64_t>, JpUploadStream> streams_;
  std::function<void()> waker_;
  size_t bytes_ = 0;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_HOST_BUFFERS_H_
