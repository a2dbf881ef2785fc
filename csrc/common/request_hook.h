// The narrow boundary between the gRPC frontend (module _frontend) and the
// sessions' fast path (module _core, beside the dispatcher): two tables of
// C function pointers, handed over as PyCapsules named below. C, not C++
// classes: the two modules are separate shared objects, each with its own
// copy of everything they link, and only plain functions and data cross.
// A change to either struct is a new version (and capsule name).
#ifndef JAX_PATHWAYS_CSRC_COMMON_REQUEST_HOOK_H_
#define JAX_PATHWAYS_CSRC_COMMON_REQUEST_HOOK_H_

#include <cstddef>
#include <cstdint>

extern "C" {

// The frontend's way to answer a session stream, from any thread.
struct JpReplySink {
  uint32_t version;  // 3
  void* server;
  // Queues one IfrtResponse on stream `stream`; 0 if the stream is gone.
  int (*send)(void* server, uint64_t stream, const char* data, size_t size);
  // Stores `size` bytes at `data` as host buffer `handle` of host-buffer
  // session `session` (a download the client looks up after the reply),
  // without a copy: the frontend calls release(owner) once it no longer
  // needs them, at once if storing fails. Returns 0, or the absl status
  // code why not, its message in `error` (NUL-terminated, truncated to
  // `error_size`).
  int (*store)(void* server, uint64_t session, uint64_t handle,
               const char* data, size_t size, void (*release)(void* owner),
               void* owner, char* error, size_t error_size);
  // Takes upload `handle` of host-buffer session `session` if it has
  // arrived and holds exactly `size` bytes, handing its pieces in order to
  // piece(ctx, data, n, release, owner), lent: the fast path calls
  // release(owner) once done with one. Returns 1 if taken; 0 if not (not
  // arrived yet, another size, no such session), leaving it as it was.
  int (*take)(void* server, uint64_t session, uint64_t handle, size_t size,
              void (*piece)(void* ctx, const char* data, size_t n,
                            void (*release)(void* owner), void* owner),
              void* ctx);
};

// The fast path, called on the frontend's completion-queue thread with each
// IfrtRequest of a stream none of whose earlier requests Python still
// holds. Returns 1 if it took the request (its reply comes through the sink,
// perhaps later), 0 to leave it to Python. Never blocks.
struct JpRequestHook {
  uint32_t version;  // 1
  void* fast_path;
  int (*handle)(void* fast_path, uint64_t stream, const char* data,
                size_t size);
};

}  // extern "C"

inline constexpr char kReplySinkCapsule[] = "jax_pathways.JpReplySink.v3";
inline constexpr char kRequestHookCapsule[] =
    "jax_pathways.JpRequestHook.v1";

#endif  // JAX_PATHWAYS_CSRC_COMMON_REQUEST_HOOK_H_
