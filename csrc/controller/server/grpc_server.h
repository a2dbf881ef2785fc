// GrpcServer: the controller's gRPC endpoint for JAX's IFRT-proxy client.
//
// One completion-queue thread runs every call. IfrtSession streams and unary
// calls (GetVersion, the admin Status) become FrontendEvents that one Python
// thread takes in batches; Python answers with Send()/Reply()/Finish() from
// any thread. The host-buffer side channel (HostBufferStore, Lookup, Delete)
// is served here entirely, against HostBuffers: bulk bytes never wait for
// Python. Python-side per-message cost in grpcio was ~250 us on the 2-core
// machine (thread hand-offs per message); here it is one queue push.
//
// Thread safety: all public methods may be called from any thread; Poll()
// and Shutdown() block and must be called without the GIL.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_GRPC_SERVER_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_GRPC_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/blocking_queue.h"
#include "common/request_hook.h"
#include "common/status.h"
#include "controller/server/host_buffers.h"

namespace grpc {
class AsyncGenericService;
class Server;
class ServerCompletionQueue;
}  // namespace grpc

namespace jax_pathways {

struct FrontendEvent {
  enum Kind : int {
    kOpen = 1,     // a new IfrtSession stream: metadata, peer
    kRequest = 2,  // one IfrtRequest on a stream: data
    kClosed = 3,   // the stream ended (client gone or finished)
    kUnary = 4,    // a unary call for Python: method, data, metadata
    kWake = 5,     // something a waiting request needs has happened
  };
  Kind kind;
  uint64_t id = 0;  // stream or call id
  std::string method;
  std::string data;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::string peer;
};

class Call;

class GrpcServer {
 public:
  GrpcServer();
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // Binds `address` ("host:port", port 0 for any, or "unix:/path") and
  // starts serving; returns the bound port (0 for a Unix socket).
  // Messages larger than max_request_bytes end their call with
  // RESOURCE_EXHAUSTED before they are buffered (uploads come in 1 MiB
  // chunks; only a program this large would need more). A call that has
  // not sent its first request within first_message_timeout_s (a session
  // its InitRequest, a unary-style call its one request) is cut off: a
  // stream must not hold the server's resources for as long as it likes
  // before it says who it is.
  // `python_unary`, `python_streams`: the methods Python serves (its names
  // for them, controller/grpc_service.py), as unary-style calls and as
  // streams; a name ending in '/' stands for every method of a service.
  // The IFRT session and the host-buffer calls are this server's own.
  StatusOr<int> Start(const std::string& address, int max_request_bytes,
                      double first_message_timeout_s,
                      std::vector<std::string> python_unary,
                      std::vector<std::string> python_streams);
  std::vector<FrontendEvent> Poll(double timeout_s, size_t max_items);
  // Queues one response message on stream `id`; false if it is gone.
  bool Send(uint64_t id, std::string data);
  // Between Cork() and Uncork(), this thread's Send()s only queue: a burst
  // of replies starts one write per stream, at Uncork(), not one each
  // (the writes after it go out from the completion-queue thread, coalesced
  // by gRPC). Other threads' Send()s are not held.
  void Cork();
  void Uncork();
  // Python has handled `n` more requests of session stream `id` (each
  // request Python is given must be settled once it has run, so that the
  // fast path may take the stream's next ones).
  void Settle(uint64_t id, size_t n);
  // The fast path (common/request_hook.h); set before Start(), once.
  void SetRequestHook(const JpRequestHook& hook);
  // How the fast path answers (valid while this server lives).
  JpReplySink reply_sink();
  // Stream `id` (a session or callbacks stream) has the right token: its
  // messages are read from now on (none is before).
  void Admit(uint64_t id);
  // Ends stream or call `id` with `status` (after queued messages if OK).
  void Finish(uint64_t id, const Status& status);
  // Answers unary call `id`: `data` if `status` is OK.
  void Reply(uint64_t id, const Status& status, std::string data);
  // Wakes Poll() with a kWake event (an upload a request waits for was
  // stored; a waited-for island joined).
  void Wake();
  HostBuffers& host_buffers() { return host_buffers_; }
  size_t open_calls();
  // Cancels every call and stops; idempotent.
  void Shutdown();

 private:
  friend class Call;
  void SpawnCall();
  void Serve();
  std::shared_ptr<Call> Find(uint64_t id);
  void Remove(uint64_t id);
  // Runs `start` (which starts one async op) unless the queue is shut down;
  // returns whether it ran.
  template <typename F>
  bool StartOp(F start);

  std::unique_ptr<grpc::AsyncGenericService> service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::unique_ptr<grpc::Server> server_;
  std::chrono::milliseconds first_message_timeout_{10000};
  std::vector<std::string> python_unary_;    // set by Start()
  std::vector<std::string> python_streams_;  // set by Start()
  std::thread cq_thread_;
  std::mutex ops_mu_;  // guards starting ops vs. shutting the queue down
  bool cq_shut_ = false;
  std::mutex calls_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Call>> calls_;
  uint64_t next_id_ = 0;
  BlockingQueue<FrontendEvent> events_;
  HostBuffers host_buffers_;
  std::atomic<bool> shut_down_{false};
  JpRequestHook hook_{1, nullptr, nullptr};
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_GRPC_SERVER_H_
