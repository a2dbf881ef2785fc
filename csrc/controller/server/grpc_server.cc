#include "controller/server/grpc_server.h"

#include <grpcpp/alarm.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string_view>

#include "common/bytes.h"
#include "common/thread_name.h"
#include "controller/server/host_buffer_messages.h"

namespace jax_pathways {
namespace {

constexpr std::string_view kService = "/xla.ifrt.proxy.GrpcIfrtService/";
constexpr char kStoreMetadata[] =
    "ifrt-proxy-grpc-host-buffer-store-metadata-bin";
constexpr size_t kChunk = 1 << 20;  // as the reference server streams
// An upload's piece costs ~100 bytes of bookkeeping here: one sent in tiny
// chunks must not cost the controller many times its size. Beyond a few,
// pieces must average 1 KiB (JAX's client sends 1 MiB chunks, ~40 KiB a
// piece).
constexpr size_t kFreePieces = 64;
constexpr size_t kMinPieceBytes = 1024;

uint64_t PhysicalMemory() {
  static const uint64_t bytes =
      static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
      static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return bytes;
}
// How long a request the fast path would take waits for its upload (sent
// beside it, so mostly there within a millisecond) before it goes to
// Python, which waits on, bounded, and words what comes of it.
constexpr auto kUploadWait = std::chrono::seconds(1);

enum class CallKind {
  kSession, kStream, kUnary, kStore, kLookup, kDelete, kRefused
};

// Whether `method` is one of `names` (a name ending in '/': any method of
// that service).
bool Names(const std::vector<std::string>& names, const std::string& method) {
  return std::any_of(names.begin(), names.end(), [&](const std::string& n) {
    return !n.empty() && n.back() == '/' ? method.rfind(n, 0) == 0
                                         : method == n;
  });
}

CallKind KindOf(const std::string& method,
                const std::vector<std::string>& python_unary,
                const std::vector<std::string>& python_streams) {
  if (method.rfind(kService, 0) == 0) {
    std::string name = method.substr(kService.size());
    if (name == "IfrtSession") return CallKind::kSession;
    if (name == "HostBufferStore") return CallKind::kStore;
    if (name == "HostBufferLookup") return CallKind::kLookup;
    if (name == "HostBufferDelete") return CallKind::kDelete;
  }
  if (Names(python_unary, method)) return CallKind::kUnary;
  if (Names(python_streams, method)) return CallKind::kStream;
  return CallKind::kRefused;
}

grpc::Status ToGrpc(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// Streams a corked thread queued writes on without starting them
// (GrpcServer::Cork); null when the thread is not corked.
thread_local std::vector<std::shared_ptr<Call>>* corked_calls = nullptr;

}  // namespace

// One RPC of any method: a small state machine driven by the completion
// queue thread (OnEvent) and by Python (Send/Reply/Finish), under `mu_`.
//
// Lifetime: the server's map holds the Call until its last tag is back.
// Every started op holds a tag, and kDone (the RPC is over) is always one of
// them, so no op may start once kDone is in: the pending count then only
// falls, and the OnEvent that takes it to zero is the last touch of this
// Call by the queue. Python may still hold a reference from Find(); its
// Send/Finish/Reply then start nothing.
class Call {
 public:
  enum TagKind {
    kNew, kRead, kWrite, kFinish, kDone, kAlarm, kResume, kNumTags
  };
  struct Tag {
    Call* call;
    TagKind kind;
  };

  Call(GrpcServer* server, uint64_t id) : server_(server), id_(id) {
    for (int k = 0; k < kNumTags; ++k) tags_[k] = Tag{this, TagKind(k)};
  }

  grpc::GenericServerContext* context() { return &ctx_; }
  grpc::GenericServerAsyncReaderWriter* stream() { return &stream_; }
  Tag* tag(TagKind k) { return &tags_[k]; }
  void set_pending(int n) { pending_ = n; }

  void OnEvent(TagKind kind, bool ok);
  bool Send(std::string data);
  // Starts writing what Send() queued while its thread was corked.
  void Flush();
  // Python has handled `n` more of the requests it was given (see owed_);
  // what was held behind them is offered to the fast path now, on the
  // caller's thread.
  void Settle(size_t n);
  // The upload the request in waiting_ waits for is stored (or its
  // session ended): it is offered again, on the queue thread.
  void Resume();
  // Python accepted the session: it reads its requests from now on.
  void Admit();
  void Finish(const Status& status);  // graceful if OK, else at once
  void Reply(const Status& status, std::string data);

 private:
  void OnNew(bool ok);
  void OnRead(bool ok);
  void StartRead();
  // Cancels the call unless its first message comes within the server's
  // first-message timeout.
  void ExpectFirstMessage();
  void WriteNext();
  void RequestFinish(const Status& status, bool drop_writes);
  // Ends the call: with `message`, then OK, if `status` is OK; else with
  // `status` alone.
  void FinishWith(const Status& status, std::string message);
  // Runs `start` (which starts one async op, holding a tag) unless the
  // queue is shut down, counting the op in pending_; returns whether it ran.
  template <typename F>
  bool StartOp(F start);
  void StartFinish();
  void Push(FrontendEvent::Kind kind, std::string data);
  // Offers `request`, then what is held behind it, to the fast path, outside
  // mu_, until one is declined (it goes to Python, which then owes it) or
  // none is left. The caller has set offering_.
  void Offer(std::string request);
  // Requires mu_. The client half-closed: what is held goes to Python (a
  // request Python waits on must hear of the close at once, and fails;
  // order is kept), then kClosed.
  void PushClosed();
  void ServeLookup(const std::string& request);
  void FinishUpload();
  bool AppendUpload();
  bool AddChunk();
  bool TooLarge();

  GrpcServer* const server_;
  const uint64_t id_;
  grpc::GenericServerContext ctx_;
  grpc::GenericServerAsyncReaderWriter stream_{&ctx_};
  Tag tags_[kNumTags];

  std::mutex mu_;
  CallKind kind_ = CallKind::kRefused;
  int pending_ = 0;  // async ops in flight
  grpc::ByteBuffer read_buf_;
  grpc::ByteBuffer write_buf_;
  std::deque<std::string> writes_;
  // Session requests given to Python and not settled: while any is, later
  // ones wait in held_, so that each is handled after those before it.
  size_t owed_ = 0;
  // Requests read while Python owed one (or while the fast path was being
  // offered one): offered to the fast path in order once Python has
  // settled, so that a burst behind one request Python handles does not
  // all go to Python. Only with a fast path.
  std::deque<std::string> held_;
  // A thread is offering this stream's requests to the fast path (Offer):
  // one at a time, in order.
  bool offering_ = false;
  // The client half-closed while a request was being offered: once it is
  // settled, what is held goes to Python, then kClosed (PushClosed).
  bool close_held_ = false;
  // A request read while none was owed, for the fast path (CQ thread only).
  std::optional<std::string> fast_request_;
  // Requires mu_. Stops the wait of waiting_ now (the alarm's tag comes
  // back at once).
  void EndWait();
  // The request the fast path waits to take until its upload is stored
  // (JP_WAIT_FOR_UPLOAD), up to kUploadWait; offering_ stays set
  // meanwhile, so later ones wait in held_. The alarm's tag (kResume)
  // offers it again, on the queue thread.
  std::optional<std::string> waiting_;
  grpc::Alarm resume_alarm_;
  bool resume_armed_ = false;
  bool resume_now_ = false;  // ended before the alarm was armed
  bool writing_ = false;
  bool done_ = false;  // kDone is in: the RPC is over, start no op
  grpc::Alarm alarm_;  // the first-message deadline
  bool alarm_set_ = false;
  bool first_read_ = false;
  // A stream reads nothing until Python has accepted the token in its
  // headers (Admit): one without it costs the controller no message (gRPC's
  // flow control holds the client's bytes back), however many it sends.
  bool admitted_ = false;
  bool broken_ = false;
  bool closed_pushed_ = false;
  bool finish_requested_ = false;
  bool finish_started_ = false;
  grpc::Status finish_status_;
  // HostBufferStore
  uint64_t session_ = 0, handle_ = 0, expected_ = 0;
  // gRPC's receive slices, referenced, not copied (host_buffers.h).
  HostBuffer upload_;
  size_t uploaded_ = 0;
  // What of upload_ went to its stream (HostBuffers::Arrived).
  size_t pieces_sent_ = 0;
  uint64_t bytes_sent_ = 0;
  // HostBufferLookup: the pieces still to send, the first one partly sent.
  std::optional<std::deque<Bytes>> download_;
  bool download_started_ = false;
};

template <typename F>
bool Call::StartOp(F start) {
  if (!server_->StartOp(start)) return false;
  ++pending_;
  return true;
}

void Call::OnEvent(TagKind kind, bool ok) {
  bool remove = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --pending_;
    switch (kind) {
      case kNew:
        OnNew(ok);
        break;
      case kRead:
        OnRead(ok);
        break;
      case kWrite:
        writing_ = false;
        if (!ok) {
          broken_ = true;
          writes_.clear();
          download_.reset();
        }
        WriteNext();
        if (!writing_ && finish_requested_) StartFinish();
        break;
      case kFinish:
        break;
      case kAlarm:
        // Fired (ok), not cancelled: the request never came.
        if (ok && !first_read_) ctx_.TryCancel();
        break;
      case kResume:  // the upload came, the wait ended, or kUploadWait
        resume_armed_ = resume_now_ = false;
        if (waiting_ && !done_) fast_request_ = std::move(waiting_);
        waiting_.reset();
        break;
      case kDone:
        done_ = true;
        if ((kind_ == CallKind::kSession || kind_ == CallKind::kStream) &&
            !closed_pushed_) {
          Push(FrontendEvent::kClosed, "");
        }
        EndWait();
        break;
      default:
        break;
    }
    remove = pending_ == 0;
  }
  if (fast_request_) {
    // Outside mu_: the fast path may answer at once, through Send().
    std::string request = std::move(*fast_request_);
    fast_request_.reset();
    Offer(std::move(request));
  }
  if (remove) server_->Remove(id_);  // may destroy *this: last statement
}

void Call::Settle(size_t n) {
  std::string request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    owed_ = n < owed_ ? owed_ - n : 0;
    if (owed_ > 0 || offering_ || held_.empty() || done_) return;
    offering_ = true;
    request = std::move(held_.front());
    held_.pop_front();
  }
  Offer(std::move(request));
}

void Call::Admit() {
  std::lock_guard<std::mutex> lock(mu_);
  if (admitted_) return;
  admitted_ = true;
  StartRead();
}

void Call::Resume() {
  std::lock_guard<std::mutex> lock(mu_);
  EndWait();
}

void Call::EndWait() {
  if (!waiting_) return;
  if (resume_armed_) {
    resume_alarm_.Cancel();
  } else {
    resume_now_ = true;
  }
}

void Call::Offer(std::string request) {
  const JpRequestHook& hook = server_->hook_;
  while (true) {
    uint64_t wait_session = 0, wait_handle = 0;
    int verdict = hook.handle(hook.fast_path, id_, request.data(),
                              request.size(), &wait_session, &wait_handle);
    if (verdict == JP_WAIT_FOR_UPLOAD) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (done_) {
          offering_ = false;
          return;
        }
        waiting_ = std::move(request);
      }
      // Not `this`: the Call may be gone by the time the upload is stored.
      bool watching = server_->host_buffers_.WatchStore(
          wait_session, wait_handle, [server = server_, id = id_] {
            if (std::shared_ptr<Call> call = server->Find(id)) call->Resume();
          });
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) {  // no op starts once kDone is in
        waiting_.reset();
        resume_now_ = offering_ = false;
        return;
      }
      if (watching) {
        // The wake may have come already (resume_now_).
        auto deadline = std::chrono::system_clock::now();
        if (!resume_now_) deadline += kUploadWait;
        if (StartOp([&] {
              resume_alarm_.Set(server_->cq_.get(), deadline, tag(kResume));
            })) {
          resume_armed_ = true;
          return;
        }
      }
      // Stored meanwhile, its session gone, or the server shutting down:
      // offered again now (the fast path does not make it wait for that
      // upload twice).
      request = std::move(*waiting_);
      waiting_.reset();
      resume_now_ = false;
      continue;
    }
    bool taken = verdict == 1;
    std::lock_guard<std::mutex> lock(mu_);
    if (!taken && !done_) {  // over: Python has heard kClosed already
      ++owed_;
      Push(FrontendEvent::kRequest, std::move(request));
    }
    if (close_held_ && !done_) {
      offering_ = false;
      PushClosed();
      return;
    }
    if (owed_ > 0 || held_.empty() || done_) {
      offering_ = false;
      return;
    }
    request = std::move(held_.front());
    held_.pop_front();
  }
}

void Call::PushClosed() {
  for (std::string& request : held_) {
    ++owed_;
    Push(FrontendEvent::kRequest, std::move(request));
  }
  held_.clear();
  if (!closed_pushed_) Push(FrontendEvent::kClosed, "");
}

void Call::OnNew(bool ok) {
  if (!ok) return;  // the server is shutting down
  server_->SpawnCall();
  kind_ = KindOf(ctx_.method(), server_->python_unary_,
                 server_->python_streams_);
  switch (kind_) {
    case CallKind::kSession:
    case CallKind::kStream:
      Push(FrontendEvent::kOpen, "");  // reads once admitted
      // A callbacks stream may be silent until a callback is answered.
      if (kind_ == CallKind::kSession) ExpectFirstMessage();
      return;
    case CallKind::kUnary:
    case CallKind::kLookup:
    case CallKind::kDelete:
      StartRead();
      ExpectFirstMessage();
      return;
    case CallKind::kStore: {
      auto md = ctx_.client_metadata().find(kStoreMetadata);
      if (md == ctx_.client_metadata().end()) {
        RequestFinish(Internal("HostBufferStore without its metadata header"),
                      true);
        return;
      }
      xla::ifrt::proxy::GrpcHostBufferStoreMetadata store;
      if (!store.ParseFromArray(md->second.data(),
                                static_cast<int>(md->second.size())) ||
          store.buffer_size() < 0) {
        RequestFinish(DataLoss("unparsable HostBufferStore metadata"), true);
        return;
      }
      session_ = store.session_id();
      handle_ = store.handle();
      expected_ = static_cast<uint64_t>(store.buffer_size());
      if (!server_->host_buffers_.HasSession(session_)) {
        RequestFinish(NotFound("unknown session " + std::to_string(session_)),
                      true);
        return;
      }
      // Pieces are kept as they arrive, nothing is allocated ahead; an
      // upload larger than this host's memory could never be kept.
      if (expected_ > PhysicalMemory()) {
        RequestFinish(Status(Code::kResourceExhausted,
                             "no room for a host buffer of " +
                                 std::to_string(expected_) +
                                 " bytes: larger than this host's memory"),
                      true);
        return;
      }
      StartRead();
      return;
    }
    case CallKind::kRefused:
      RequestFinish(Status(Code::kUnimplemented,
                           "jax_pathways does not serve " + ctx_.method()),
                    true);
      return;
  }
}

void Call::ExpectFirstMessage() {
  alarm_set_ = StartOp([&] {
    alarm_.Set(server_->cq_.get(),
               std::chrono::system_clock::now() +
                   server_->first_message_timeout_,
               tag(kAlarm));
  });
}

void Call::OnRead(bool ok) {
  if (!first_read_) {
    first_read_ = true;
    if (alarm_set_) alarm_.Cancel();  // its tag still comes back, !ok
  }
  switch (kind_) {
    case CallKind::kSession:
      if (ok) {
        // Without a fast path, Python answers every request. Else the
        // fast path is asked first (OnEvent, after mu_), unless an earlier
        // request of this stream is still with Python or being offered:
        // then it waits its turn in held_ (requests are handled in order).
        if (server_->hook_.handle == nullptr) {
          ++owed_;
          Push(FrontendEvent::kRequest, Flatten(read_buf_));
        } else if (owed_ == 0 && !offering_ && held_.empty()) {
          offering_ = true;
          fast_request_ = Flatten(read_buf_);
        } else {
          held_.push_back(Flatten(read_buf_));
        }
        StartRead();
      } else if (!closed_pushed_) {
        // No more requests; Python finishes the stream once it has sent
        // every reply (the client may have only half-closed).
        if (offering_) {
          close_held_ = true;  // after the request being offered
          EndWait();  // Python waits for its upload, and hears the close
        } else {
          PushClosed();
        }
      }
      return;
    case CallKind::kStream:  // never the fast path's; nothing is owed
      if (ok) {
        Push(FrontendEvent::kRequest, Flatten(read_buf_));
        StartRead();
      } else if (!closed_pushed_) {
        Push(FrontendEvent::kClosed, "");
      }
      return;
    case CallKind::kUnary:
      if (ok) {
        Push(FrontendEvent::kUnary, Flatten(read_buf_));
      } else {
        RequestFinish(InvalidArgument("unary call without a request"), true);
      }
      return;
    case CallKind::kStore:
      if (!ok) {
        FinishUpload();
      } else if (AppendUpload()) {
        StartRead();
      }
      return;
    case CallKind::kLookup:
      if (ok) {
        ServeLookup(Flatten(read_buf_));
      } else {
        RequestFinish(InvalidArgument("lookup without a request"), true);
      }
      return;
    case CallKind::kDelete: {
      xla::ifrt::proxy::GrpcHostBufferDeleteRequest request;
      if (!ok || !request.ParseFromString(Flatten(read_buf_))) {
        RequestFinish(InvalidArgument("malformed HostBufferDelete"), true);
        return;
      }
      FinishWith(server_->host_buffers_.Delete(request.session_id(),
                                               request.handle()),
                 "");
      return;
    }
    case CallKind::kRefused:
      return;
  }
}

// Adds one HostBufferStore chunk to the upload, unless the upload has come
// in too many pieces for its size (kMinPieceBytes).
bool Call::AppendUpload() {
  if (!AddChunk()) return false;
  server_->host_buffers_.Arrived(session_, handle_, upload_, &pieces_sent_,
                                 &bytes_sent_);
  if (upload_.size() > kFreePieces + uploaded_ / kMinPieceBytes) {
    RequestFinish(Status(Code::kResourceExhausted,
                         "host buffer " + std::to_string(handle_) +
                             " came in " + std::to_string(upload_.size()) +
                             " pieces for " + std::to_string(uploaded_) +
                             " bytes: send chunks of at least 1 KiB"),
                  true);
    return false;
  }
  return true;
}

// The chunk (field 1 of the message) as pieces of the upload. The usual
// chunk is that one field: gRPC's slices after its head become the
// pieces, shared, not copied (each keeps its slice alive).
bool Call::AddChunk() {
  std::vector<grpc::Slice> slices;
  size_t total = read_buf_.Length();
  if (read_buf_.Dump(&slices).ok() && !slices.empty()) {
    std::string_view first(reinterpret_cast<const char*>(slices[0].begin()),
                           slices[0].size());
    size_t head = DataHeadSize(first, total);
    if (head > 0) {
      if (total - head > expected_ - uploaded_) return TooLarge();
      size_t skip = head;
      for (grpc::Slice& sl : slices) {
        size_t len = sl.size();
        if (skip >= len) {
          skip -= len;
          continue;
        }
        auto owner = std::make_shared<grpc::Slice>(std::move(sl));
        const char* at = reinterpret_cast<const char*>(owner->begin()) + skip;
        upload_.push_back(Bytes::Borrow(owner, at, len - skip));
        uploaded_ += len - skip;
        skip = 0;
      }
      return true;
    }
  }
  // Another encoding of the same message: parsed whole, its bytes copied.
  xla::ifrt::proxy::GrpcHostBufferStoreRequest message;
  if (!message.ParseFromString(Flatten(read_buf_))) {
    RequestFinish(DataLoss("malformed HostBufferStore chunk"), true);
    return false;
  }
  const std::string& chunk = message.data();
  if (chunk.size() > expected_ - uploaded_) return TooLarge();
  if (!chunk.empty()) {
    char* w;
    StatusOr<Bytes> piece = Bytes::Allocate(chunk.size(), &w);
    if (!piece.ok()) {
      RequestFinish(piece.status(), true);
      return false;
    }
    std::memcpy(w, chunk.data(), chunk.size());
    upload_.push_back(std::move(piece.value()));
  }
  uploaded_ += chunk.size();
  return true;
}

bool Call::TooLarge() {
  RequestFinish(DataLoss("host buffer " + std::to_string(handle_) +
                         " is larger than announced"),
                true);
  return false;
}

void Call::FinishUpload() {
  if (uploaded_ != expected_) {
    RequestFinish(DataLoss("host buffer " + std::to_string(handle_) + ": got " +
                           std::to_string(uploaded_) + " bytes, expected " +
                           std::to_string(expected_)),
                  true);
    return;
  }
  // A stream that started after the last chunk came gets it all now.
  server_->host_buffers_.Arrived(session_, handle_, upload_, &pieces_sent_,
                                 &bytes_sent_);
  FinishWith(
      server_->host_buffers_.Store(session_, handle_, std::move(upload_)),
      "");  // an empty GrpcHostBufferStoreResponse
}

void Call::ServeLookup(const std::string& request) {
  xla::ifrt::proxy::GrpcHostBufferLookupRequest lookup;
  if (!lookup.ParseFromString(request)) {
    RequestFinish(InvalidArgument("malformed HostBufferLookup"), true);
    return;
  }
  StatusOr<HostBuffer> found =
      server_->host_buffers_.Lookup(lookup.session_id(), lookup.handle());
  if (!found.ok()) {
    RequestFinish(found.status(), true);
    return;
  }
  download_.emplace(found.value().begin(), found.value().end());
  RequestFinish(Status::Ok(), false);
  WriteNext();
}

void Call::StartRead() {
  if (finish_requested_ || done_) return;
  StartOp([&] { stream_.Read(&read_buf_, tag(kRead)); });
}

void Call::WriteNext() {
  if (writing_ || broken_ || done_) return;
  if (!writes_.empty()) {
    grpc::Slice slice(writes_.front());
    writes_.pop_front();
    write_buf_ = grpc::ByteBuffer(&slice, 1);
  } else if (download_ && (!download_started_ || !download_->empty())) {
    // Always at least one message, even for an empty buffer. Its bytes go
    // out as a slice of the stored buffer (kept alive by the slice), not
    // copied into the message; a message never spans two pieces.
    while (!download_->empty() && download_->front().empty()) {
      download_->pop_front();
    }
    size_t n = download_->empty()
                   ? 0
                   : std::min(kChunk, download_->front().size());
    std::vector<grpc::Slice> slices = {grpc::Slice(DataHead(n))};
    if (n > 0) {
      Bytes& piece = download_->front();
      auto* chunk = new Bytes(piece.Slice(0, n));
      slices.emplace_back(const_cast<char*>(chunk->data()), n,
                          [](void* b) { delete static_cast<Bytes*>(b); },
                          chunk);
      piece = piece.Slice(n, piece.size() - n);
      if (piece.empty()) download_->pop_front();
    }
    write_buf_ = grpc::ByteBuffer(slices.data(), slices.size());
    download_started_ = true;
    if (download_->empty()) download_.reset();
  } else {
    return;
  }
  // More queued behind it: gRPC may hold this one and send them together.
  grpc::WriteOptions options;
  if (!writes_.empty()) options.set_buffer_hint();
  if (StartOp([&] { stream_.Write(write_buf_, options, tag(kWrite)); })) {
    writing_ = true;
  }
}

void Call::RequestFinish(const Status& status, bool drop_writes) {
  if (finish_requested_) return;
  finish_requested_ = true;
  finish_status_ = ToGrpc(status);
  if (drop_writes) {
    writes_.clear();
    download_.reset();
  }
  if (!writing_ && writes_.empty() && !download_) StartFinish();
}

void Call::FinishWith(const Status& status, std::string message) {
  if (status.ok()) writes_.push_back(std::move(message));
  RequestFinish(status, !status.ok());
  WriteNext();
}

void Call::StartFinish() {
  if (finish_started_ || done_ || !writes_.empty() || download_) return;
  finish_started_ = true;
  StartOp([&] { stream_.Finish(finish_status_, tag(kFinish)); });
}

void Call::Push(FrontendEvent::Kind kind, std::string data) {
  FrontendEvent e;
  e.kind = kind;
  e.id = id_;
  e.data = std::move(data);
  if (kind == FrontendEvent::kOpen || kind == FrontendEvent::kUnary) {
    e.method = ctx_.method();
    e.peer = ctx_.peer();
    for (const auto& [k, v] : ctx_.client_metadata()) {
      e.metadata.emplace_back(std::string(k.data(), k.size()),
                              std::string(v.data(), v.size()));
    }
  }
  if (kind == FrontendEvent::kClosed) closed_pushed_ = true;
  server_->events_.Push(std::move(e));
}

bool Call::Send(std::string data) {
  std::lock_guard<std::mutex> lock(mu_);
  if ((kind_ != CallKind::kSession && kind_ != CallKind::kStream) ||
      finish_requested_ || broken_ || done_) {
    return false;
  }
  writes_.push_back(std::move(data));
  if (corked_calls == nullptr) WriteNext();
  return true;
}

void Call::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  WriteNext();
}

void Call::Finish(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  WriteNext();  // what a corked Send() queued goes out first
  RequestFinish(status, !status.ok());
}

void Call::Reply(const Status& status, std::string data) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind_ != CallKind::kUnary || finish_requested_) return;
  FinishWith(status, std::move(data));
}

// ---------------------------------------------------------------- GrpcServer

GrpcServer::GrpcServer()
    : service_(std::make_unique<grpc::AsyncGenericService>()) {
  host_buffers_.set_waker([this] { Wake(); });
}

GrpcServer::~GrpcServer() { Shutdown(); }

StatusOr<int> GrpcServer::Start(const std::string& address,
                                int max_request_bytes,
                                double first_message_timeout_s,
                                std::vector<std::string> python_unary,
                                std::vector<std::string> python_streams) {
  first_message_timeout_ = std::chrono::milliseconds(
      static_cast<int64_t>(first_message_timeout_s * 1000));
  python_unary_ = std::move(python_unary);
  python_streams_ = std::move(python_streams);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(max_request_bytes);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterAsyncGenericService(service_.get());
  cq_ = builder.AddCompletionQueue();
  server_ = builder.BuildAndStart();
  bool unix_socket = address.rfind("unix:", 0) == 0;
  if (!server_ || (port == 0 && !unix_socket)) {
    return Unavailable("could not listen on " + address);
  }
  // A few calls waiting to be matched, so bursts of new RPCs (host-buffer
  // uploads) need not wait for the queue thread.
  for (int i = 0; i < 8; ++i) SpawnCall();
  cq_thread_ = std::thread([this] {
    NameThisThread("jp-grpc-cq");
    Serve();
  });
  return unix_socket ? 0 : port;
}

void GrpcServer::SpawnCall() {
  std::shared_ptr<Call> call;
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    id = ++next_id_;
    call = std::make_shared<Call>(this, id);
    calls_[id] = call;
  }
  // Both tags always come back: kDone when the RPC ends, kNew when it
  // starts (ok=false if the server shuts down first).
  call->set_pending(2);
  Call* raw = call.get();
  bool started = StartOp([&] {
    raw->context()->AsyncNotifyWhenDone(raw->tag(Call::kDone));
    service_->RequestCall(raw->context(), raw->stream(), cq_.get(), cq_.get(),
                          raw->tag(Call::kNew));
  });
  if (!started) Remove(id);
}

void GrpcServer::Serve() {
  void* tag;
  bool ok;
  while (cq_->Next(&tag, &ok)) {
    auto* t = static_cast<Call::Tag*>(tag);
    t->call->OnEvent(t->kind, ok);
  }
}

template <typename F>
bool GrpcServer::StartOp(F start) {
  std::lock_guard<std::mutex> lock(ops_mu_);
  if (cq_shut_) return false;
  start();
  return true;
}

std::shared_ptr<Call> GrpcServer::Find(uint64_t id) {
  std::lock_guard<std::mutex> lock(calls_mu_);
  auto it = calls_.find(id);
  return it == calls_.end() ? nullptr : it->second;
}

void GrpcServer::Remove(uint64_t id) {
  decltype(calls_)::node_type doomed;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(calls_mu_);
  doomed = calls_.extract(id);
}

std::vector<FrontendEvent> GrpcServer::Poll(double timeout_s,
                                            size_t max_items) {
  return events_.Pop(timeout_s, max_items);
}

void GrpcServer::Wake() {
  FrontendEvent e;
  e.kind = FrontendEvent::kWake;
  events_.Push(std::move(e));
}

bool GrpcServer::Send(uint64_t id, std::string data) {
  std::shared_ptr<Call> call = Find(id);
  if (call == nullptr || !call->Send(std::move(data))) return false;
  if (corked_calls != nullptr &&
      (corked_calls->empty() || corked_calls->back() != call)) {
    corked_calls->push_back(std::move(call));
  }
  return true;
}

void GrpcServer::Settle(uint64_t id, size_t n) {
  if (std::shared_ptr<Call> call = Find(id)) call->Settle(n);
}

void GrpcServer::SetRequestHook(const JpRequestHook& hook) {
  hook_ = hook;
}

JpReplySink GrpcServer::reply_sink() {
  JpReplySink sink;
  sink.version = 5;
  sink.server = this;
  sink.send = [](void* server, uint64_t stream, const char* data,
                 size_t size) -> int {
    return static_cast<GrpcServer*>(server)->Send(stream,
                                                  std::string(data, size));
  };
  sink.store = [](void* server, uint64_t session, uint64_t handle,
                  const char* data, size_t size, void (*release)(void*),
                  void* owner, char* error, size_t error_size) -> int {
    // The other module's bytes, kept until the last reader lets go.
    std::shared_ptr<const void> keep(owner, release);
    Status status = static_cast<GrpcServer*>(server)->host_buffers().Store(
        session, handle, {Bytes::Borrow(std::move(keep), data, size)});
    if (status.ok()) return 0;
    if (error_size > 0) {
      size_t n = std::min(error_size - 1, status.message().size());
      std::memcpy(error, status.message().data(), n);
      error[n] = '\0';
    }
    return static_cast<int>(status.code());
  };
  sink.take = [](void* server, uint64_t session, const uint64_t* handles,
                 const size_t* sizes, size_t n,
                 void (*piece)(void*, size_t, const char*, size_t,
                               void (*)(void*), void*),
                 void* ctx, size_t* missing) -> int {
    std::optional<std::vector<HostBuffer>> taken =
        static_cast<GrpcServer*>(server)->host_buffers().TakeAllIfSizes(
            session, std::vector<uint64_t>(handles, handles + n),
            std::vector<size_t>(sizes, sizes + n), missing);
    if (!taken) return 0;
    for (size_t i = 0; i < n; ++i) {
      for (Bytes& b : (*taken)[i]) {
        auto* owner = new Bytes(std::move(b));
        piece(ctx, i, owner->data(), owner->size(),
              [](void* p) { delete static_cast<Bytes*>(p); }, owner);
      }
    }
    return 1;
  };
  sink.wake = [](void* server) { static_cast<GrpcServer*>(server)->Wake(); };
  return sink;
}

void GrpcServer::Cork() {
  if (corked_calls == nullptr) {
    corked_calls = new std::vector<std::shared_ptr<Call>>();
  }
}

void GrpcServer::Uncork() {
  std::unique_ptr<std::vector<std::shared_ptr<Call>>> calls(
      std::exchange(corked_calls, nullptr));
  if (calls == nullptr) return;
  for (const std::shared_ptr<Call>& call : *calls) call->Flush();
}

void GrpcServer::Admit(uint64_t id) {
  if (std::shared_ptr<Call> call = Find(id)) call->Admit();
}

void GrpcServer::Finish(uint64_t id, const Status& status) {
  if (std::shared_ptr<Call> call = Find(id)) call->Finish(status);
}

void GrpcServer::Reply(uint64_t id, const Status& status, std::string data) {
  if (std::shared_ptr<Call> call = Find(id)) {
    call->Reply(status, std::move(data));
  }
}

size_t GrpcServer::open_calls() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  return calls_.size();
}

void GrpcServer::Shutdown() {
  if (shut_down_.exchange(true) || !server_) return;
  // Cancels every RPC; their pending ops come back with ok=false.
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(200));
  {
    std::lock_guard<std::mutex> lock(ops_mu_);
    cq_shut_ = true;
    cq_->Shutdown();
  }
  if (cq_thread_.joinable()) cq_thread_.join();
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    calls_.clear();
  }
  events_.Close();
}

}  // namespace jax_pathways
