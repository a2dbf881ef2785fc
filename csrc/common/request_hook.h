// The narrow boundary between the gRPC frontend (module _server) and the
// sessions' fast path and dispatcher (module _core): tables of C function
// pointers, handed over as PyCapsules named below. C, not C++
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
  uint32_t version;  // 5
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
  // Takes uploads handles[0..n) of host-buffer session `session` if every
  // one has arrived holding sizes[i] bytes and no handle is named twice,
  // handing each one's pieces in order to piece(ctx, i, data, size,
  // release, owner), lent: the fast path calls release(owner) once done
  // with one. Returns 1 if taken; else 0, leaving them all as they were,
  // with *missing the index of the last one not arrived yet, or n if every
  // one has (one of another size, a handle named twice, no such session).
  int (*take)(void* server, uint64_t session, const uint64_t* handles,
              const size_t* sizes, size_t n,
              void (*piece)(void* ctx, size_t i, const char* data,
                            size_t size, void (*release)(void* owner),
                            void* owner),
              void* ctx, size_t* missing);
  // Wakes the frontend's Python loop (its WAKE event).
  void (*wake)(void* server);
};

// The fast path, called on the frontend's completion-queue thread with each
// IfrtRequest of a stream none of whose earlier requests Python still
// holds. Returns 1 if it took the request (its reply comes through the sink,
// perhaps later), 0 to leave it to Python, or 2 (JP_WAIT_FOR_UPLOAD) if it
// would take it once upload `*wait_handle` of host-buffer session
// `*wait_session` has arrived: the frontend offers it again then, or once
// that session has ended (the stream's later requests wait behind it). A
// request is told to wait again only for an upload it names before the one
// it last waited for: at most once per upload. Never blocks.
#define JP_WAIT_FOR_UPLOAD 2
struct JpRequestHook {
  uint32_t version;  // 2
  void* fast_path;
  int (*handle)(void* fast_path, uint64_t stream, const char* data,
                size_t size, uint64_t* wait_session, uint64_t* wait_handle);
};

// Where an upload still arriving goes while it arrives (the dispatcher's:
// staged on the workers that will put it, so their copy, or the bytes' trip
// to a worker on another host, overlaps the client's sending). The
// frontend calls forward() on its gRPC thread with each batch of pieces as
// it comes, in order; it holds a reference to the target while it may
// (retain / release). None of them blocks.
struct JpUploadStream {
  uint32_t version;  // 2
  void* target;
  // The upload's next `n` pieces, `offset` bytes into it. They stay valid
  // until the stream calls done(owner), exactly once (at once if it keeps
  // none of them): a worker on another host is sent them later, from
  // another thread.
  void (*forward)(void* target, uint64_t offset, const char* const* data,
                  const size_t* sizes, size_t n, void (*done)(void* owner),
                  void* owner);
  // One reference to `target` more, or fewer (the last frees it).
  void (*retain)(void* target);
  void (*release)(void* target);
};

}  // extern "C"

inline constexpr char kReplySinkCapsule[] = "jax_pathways.JpReplySink.v5";
inline constexpr char kRequestHookCapsule[] =
    "jax_pathways.JpRequestHook.v2";
inline constexpr char kUploadStreamCapsule[] =
    "jax_pathways.JpUploadStream.v2";

#endif  // JAX_PATHWAYS_CSRC_COMMON_REQUEST_HOOK_H_
