#include "executor/executor.h"

#include "common/thread_name.h"
#include "transport/local_reads.h"
#include "transport/wire.h"

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace jax_pathways {

Executor::Executor(int controller_fd, std::string controller,
                   double controller_timeout_s)
    : channel_(std::make_unique<Channel>(controller_fd)),
      controller_(controller.empty() ? "the controller"
                                     : "controller " + controller),
      controller_timeout_(controller_timeout_s),
      last_heard_(std::chrono::steady_clock::now()) {
  reader_ = std::thread([this] {
    NameThisThread("jp-ops-in");
    ReadLoop();
  });
  heartbeat_ = std::thread([this] {
    NameThisThread("jp-heartbeat");
    HeartbeatLoop();
  });
}

Executor::~Executor() { Shutdown(); }

void Executor::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_ && closed_.ok()) {
    lock.unlock();
    // Queued if the controller stops reading: this thread must keep
    // watching the controller's own heartbeats meanwhile.
    std::vector<Channel::Frame> beat;
    beat.push_back(Channel::Frame{FrameKind::kHeartbeat, {}, {}});
    Status s = channel_->SendMany(std::move(beat), nullptr);
    lock.lock();
    if (!s.ok()) return;  // the reader sees the same broken connection
    heartbeat_cv_.wait_for(lock, kHeartbeatInterval,
                           [this] { return stopping_ || !closed_.ok(); });
    if (stopping_ || !closed_.ok() || controller_timeout_.count() <= 0) {
      continue;
    }
    std::chrono::duration<double> silent =
        std::chrono::steady_clock::now() - last_heard_;
    if (silent <= controller_timeout_) continue;
    char seconds[32];
    snprintf(seconds, sizeof(seconds), "%.1f", silent.count());
    closed_ = Unavailable(controller_ + " is lost: it sent nothing, not even "
                          "a heartbeat, for " + seconds + " s (stopped, "
                          "wedged or cut off; the worker's "
                          "--controller-timeout)");
    cv_.notify_all();
    lock.unlock();
    channel_->Shutdown();  // nothing more in either direction
    return;
  }
}

void Executor::ReadLoop() {
  while (true) {
    FrameKind kind;
    Bytes body;
    Status s = channel_->Receive(&kind, &body);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      last_heard_ = std::chrono::steady_clock::now();
    }
    if (s.ok() && kind == FrameKind::kHeartbeat) continue;
    if (s.ok() && kind == FrameKind::kReadProbe) {
      s = AnswerProbe(body);
      if (s.ok()) continue;
    }
    if (s.ok() && kind == FrameKind::kOpLocal) {
      s = ReadLentTails(&body);
      kind = FrameKind::kOp;
    }
    Op op;
    if (s.ok() && kind != FrameKind::kOp) {
      s = DataLoss("controller sent a frame of kind " +
                   std::to_string(static_cast<uint32_t>(kind)));
    }
    if (s.ok()) s = DecodeOp(body, &op);
    if (s.ok() && op.kind == OpKind::kPeerLost) {
      std::lock_guard<std::mutex> lock(mu_);
      notices_.push_back(std::move(op));
      cv_.notify_all();
      continue;
    }
    std::unique_lock<std::mutex> lock(mu_);  // next_seq_ moves in Next()
    if (s.ok() && op.seq < next_seq_) {
      s = DataLoss("controller repeated op " + std::to_string(op.seq));
    }
    if (!s.ok()) {
      // The heartbeat thread may have said why first.
      if (closed_.ok()) {
        closed_ = Unavailable("controller connection lost: " + s.message());
      }
      cv_.notify_all();
      heartbeat_cv_.notify_all();
      return;
    }
    uint64_t seq = op.seq;
    reorder_.emplace(seq, std::move(op));
    bool wake = seq == next_seq_;
    lock.unlock();  // the woken thread would only block on mu_ again
    if (wake) cv_.notify_all();
  }
}

Status Executor::AnswerProbe(const Bytes& body) {
  std::string_view in = body.view();
  Location where;
  uint32_t can = 0;
  if (DecodeLocation(&in, &where) && in.empty() &&
      where.size == kReadProbePattern.size()) {
    std::string seen(where.size, '\0');
    can = ReadLocation(where, seen.data()).ok() && seen == kReadProbePattern;
  }
  WireWriter answer;
  answer.U32(can);
  return channel_->Send(FrameKind::kReadProbeAck, answer.Take());
}

Status Executor::ReadLentTails(Bytes* body) {
  std::string_view frame = body->view();
  std::vector<Location> tails;
  if (!DecodeLocations(&frame, &tails)) return DataLoss("malformed op frame");
  size_t size = frame.size();
  for (const Location& t : tails) {
    // A wrapped sum would allocate less than the reads below write.
    if (t.size > SIZE_MAX - size) return DataLoss("lent tails overflow");
    size += t.size;
  }
  // The op frame, then the tails right after it: one payload, as if sent.
  char* w;
  StatusOr<Bytes> buffer = Bytes::Allocate(size, &w);
  if (!buffer.ok()) {
    return Status(buffer.status().code(),
                  "an op's uploads: " + buffer.status().message());
  }
  Bytes whole = std::move(buffer.value());
  std::memcpy(w, frame.data(), frame.size());
  w += frame.size();
  Status s = ReadLocations(tails, w);
  if (!s.ok()) {
    return Unavailable("could not read an upload from the controller's "
                       "memory: " + s.message());
  }
  *body = std::move(whole);
  return Status::Ok();
}

StatusOr<std::vector<Op>> Executor::Next(double timeout_s, size_t max_ops) {
  std::unique_lock<std::mutex> lock(mu_);
  auto in_order = [&] {
    return !reorder_.empty() && reorder_.begin()->first == next_seq_;
  };
  std::vector<Op> ops;
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
        return !notices_.empty() || in_order() || !closed_.ok();
      })) {
    return ops;
  }
  while (!notices_.empty() && ops.size() < max_ops) {
    ops.push_back(std::move(notices_.front()));
    notices_.pop_front();
  }
  while (in_order() && ops.size() < max_ops) {
    ops.push_back(std::move(reorder_.begin()->second));
    reorder_.erase(reorder_.begin());
    ++next_seq_;
  }
  if (ops.empty()) return closed_;
  return ops;
}

Status Executor::Complete(uint64_t seq, const Status& status,
                          std::string_view payload) {
  return channel_->Send(FrameKind::kEvent,
                        EncodeEventHead(seq, status, payload.size()), payload);
}

size_t Executor::backlog() {
  std::lock_guard<std::mutex> lock(mu_);
  return reorder_.size();
}

Status Executor::closed() {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void Executor::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
    heartbeat_cv_.notify_all();
  }
  channel_->Shutdown();
  if (reader_.joinable()) reader_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
}

}  // namespace jax_pathways
