#include "worker/executor.h"

#include "common/thread_name.h"
#include "transport/local_reads.h"
#include "transport/wire.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace jax_pathways {
namespace {

// Room before a staged upload for its PUT's op frame (head and payload
// header: ~200 bytes), so that the payload is one buffer without a copy.
constexpr size_t kStagePrefix = 4096;
// A kStageData frame's stage, total and offset (u64 each).
constexpr size_t kStageDataHead = 24;
// Bytes of stages read from the controller's memory held at once (a share
// of this host's memory; kMaxStages of them at most): a stage refused for
// room costs only the overlap, its PUT reads its tails.
uint64_t MaxStagedBytes() {
  static const uint64_t bytes =
      static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
      static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) / 4;
  return bytes;
}

bool SameLocations(const std::vector<Location>& a,
                   const std::vector<Location>& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(),
                    [](const Location& x, const Location& y) {
                      return x.pid == y.pid && x.address == y.address &&
                             x.size == y.size;
                    });
}

}  // namespace

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
    // Bytes of a frame still arriving count: a long upload is no silence.
    std::chrono::duration<double> silent =
        std::chrono::steady_clock::now() -
        std::max(last_heard_, channel_->LastReceived());
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
  // An upload's bytes sent as it arrives go straight into its stage.
  const Channel::Placement into_stage{
      FrameKind::kStageData, kStageDataHead,
      [this](std::string_view head, size_t n) { return StageSpace(head, n); }};
  while (true) {
    FrameKind kind;
    Bytes body;
    Status s = channel_->Receive(&kind, &body, &into_stage);
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      last_heard_ = std::chrono::steady_clock::now();
    }
    if (s.ok() && kind == FrameKind::kHeartbeat) continue;
    if (s.ok() && kind == FrameKind::kReadProbe) {
      s = AnswerProbe(body);
      if (s.ok()) continue;
    }
    if (s.ok() && kind == FrameKind::kStage) {
      s = StagePart(body.view());
      if (s.ok()) continue;
    }
    if (s.ok() && kind == FrameKind::kStageData) continue;  // placed
    if (s.ok() && kind == FrameKind::kOpStaged) {
      s = TakeSentStage(&body);
      kind = FrameKind::kOp;
    }
    if (s.ok() && kind == FrameKind::kUnstage) {
      WireReader r(body.view());
      uint64_t stage;
      if (r.U64(&stage) && r.AtEnd()) {
        DropStage(stage);
        continue;
      }
      s = DataLoss("malformed unstage frame");
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

Status Executor::StagePart(std::string_view frame) {
  uint64_t head[3];  // stage, total, offset
  std::vector<Location> pieces;
  if (frame.size() < sizeof(head)) return DataLoss("malformed stage frame");
  std::memcpy(head, frame.data(), sizeof(head));
  frame.remove_prefix(sizeof(head));
  if (!DecodeLocations(&frame, &pieces) || !frame.empty()) {
    return DataLoss("malformed stage frame");
  }
  const auto [id, total, offset] = head;
  auto it = stages_.find(id);
  Staged* held = it == stages_.end() ? nullptr : &it->second;
  if (held == nullptr) {
    // Parts of a stage come in order for each upload in it, the uploads
    // interleaved (an array's shards): any part may be the first. One
    // refused for room leaves its PUT to read its tails.
    if (stages_.size() >= kMaxStages ||
        total > MaxStagedBytes() - staged_bytes_) {
      return Status::Ok();
    }
    StatusOr<Staged*> opened = OpenStage(id, total, /*sent=*/false);
    if (!opened.ok()) return Status::Ok();
    held = opened.value();
  }
  Staged& stage = *held;
  if (stage.sent) return DataLoss("malformed stage frame");  // not one read
  bool fits = total == stage.total && offset <= stage.total &&
              !stage.read.count(offset);
  uint64_t n = 0;
  for (const Location& p : pieces) {
    if (!fits || p.size > stage.total - offset - n) {
      fits = false;
      break;
    }
    n += p.size;
  }
  if (!fits || n > stage.total - stage.filled) {
    DropStage(id);  // more than announced
    return Status::Ok();
  }
  // A piece the controller dropped meanwhile (the upload failed) may not
  // read: the stage goes, and no PUT would have taken it.
  if (!ReadLocations(pieces, stage.base + kStagePrefix + offset).ok()) {
    DropStage(id);
    return Status::Ok();
  }
  stage.filled += n;
  stage.read.emplace(offset, std::move(pieces));
  return Status::Ok();
}

StatusOr<Executor::Staged*> Executor::OpenStage(uint64_t id, uint64_t total,
                                                bool sent) {
  Staged stage;
  StatusOr<Bytes> buffer = Bytes::Allocate(kStagePrefix + total, &stage.base);
  if (!buffer.ok()) return buffer.status();
  stage.buffer = std::move(buffer.value());
  stage.total = total;
  stage.sent = sent;
  staged_bytes_ += total;
  return &stages_.emplace(id, std::move(stage)).first->second;
}

std::optional<Executor::Staged> Executor::CloseStage(uint64_t id) {
  auto it = stages_.find(id);
  if (it == stages_.end()) return std::nullopt;
  Staged stage = std::move(it->second);
  staged_bytes_ -= stage.total;
  stages_.erase(it);
  return stage;
}

void Executor::DropStage(uint64_t stage) { CloseStage(stage); }

Bytes Executor::TakeStage(uint64_t id, std::string_view frame,
                          const std::vector<Location>& tails) {
  std::optional<Staged> stage = CloseStage(id);
  if (!stage || stage->filled != stage->total) return Bytes();
  std::vector<Location> read;  // in the upload's order
  for (auto& [offset, part] : stage->read) {
    read.insert(read.end(), part.begin(), part.end());
  }
  if (!SameLocations(read, tails)) return Bytes();
  return BehindFrame(*stage, frame);
}

Bytes Executor::BehindFrame(Staged& stage, std::string_view frame) {
  // The op frame goes right before the upload: the payload stays 64-byte
  // aligned where the frame's start is (the head is padded to that).
  if (frame.size() > kStagePrefix || (kStagePrefix - frame.size()) % 64) {
    return Bytes();
  }
  char* at = stage.base + kStagePrefix - frame.size();
  std::memcpy(at, frame.data(), frame.size());
  return stage.buffer.Slice(kStagePrefix - frame.size(),
                            frame.size() + stage.total);
}

StatusOr<char*> Executor::StageSpace(std::string_view head, size_t n) {
  uint64_t part[3];  // stage, total, offset
  if (head.size() != sizeof(part)) return DataLoss("malformed stage data");
  std::memcpy(part, head.data(), sizeof(part));
  const auto [id, total, offset] = part;
  auto it = stages_.find(id);
  Staged* held = it == stages_.end() ? nullptr : &it->second;
  if (held == nullptr) {
    // The controller sends a stage whole (any part first: an array's
    // shards interleave), and never more at once than a worker holds.
    if (stages_.size() >= kMaxStages ||
        staged_bytes_ > kMaxSentStageBytes ||
        total > kMaxSentStageBytes - staged_bytes_) {
      return DataLoss("malformed stage data (stage " + std::to_string(id) +
                      " at byte " + std::to_string(offset) + ", " +
                      std::to_string(stages_.size()) + " stages held)");
    }
    StatusOr<Staged*> opened = OpenStage(id, total, /*sent=*/true);
    if (!opened.ok()) {
      return Status(opened.status().code(),
                    "an upload streamed to this worker: " +
                        opened.status().message());
    }
    held = opened.value();
  }
  Staged& stage = *held;
  // Within the stage, and no more than it holds in all (parts that
  // overlap, from a broken controller, leave garbage in an upload it
  // sends itself, never a write outside the stage).
  if (!stage.sent || total != stage.total || offset > stage.total ||
      n > stage.total - offset || n > stage.total - stage.filled) {
    return DataLoss("malformed stage data (stage " + std::to_string(id) +
                    " at byte " + std::to_string(offset) + ")");
  }
  // Counted as in already: if the read fails, so does the connection.
  stage.filled += n;
  return stage.base + kStagePrefix + offset;
}

Status Executor::TakeSentStage(Bytes* body) {
  std::string_view frame = body->view();
  uint64_t id;
  if (frame.size() < sizeof(id)) return DataLoss("malformed op frame");
  std::memcpy(&id, frame.data(), sizeof(id));
  frame.remove_prefix(sizeof(id));
  std::optional<Staged> held = CloseStage(id);
  if (!held || !held->sent || held->filled != held->total) {
    return DataLoss("controller sent a PUT of stage " + std::to_string(id) +
                    ", which this worker does not hold whole");
  }
  Staged& stage = *held;
  ++staged_puts_;
  *body = BehindFrame(stage, frame);
  if (!body->empty()) return Status::Ok();
  // A frame too large for the room before the upload: one copy.
  char* w;
  StatusOr<Bytes> whole = Bytes::Allocate(frame.size() + stage.total, &w);
  if (!whole.ok()) {
    return Status(whole.status().code(),
                  "an op's uploads: " + whole.status().message());
  }
  std::memcpy(w, frame.data(), frame.size());
  std::memcpy(w + frame.size(), stage.base + kStagePrefix, stage.total);
  *body = std::move(whole.value());
  return Status::Ok();
}

Status Executor::ReadLentTails(Bytes* body) {
  std::string_view frame = body->view();
  std::vector<Location> tails;
  uint64_t stage;
  if (frame.size() < sizeof(stage)) return DataLoss("malformed op frame");
  std::memcpy(&stage, frame.data(), sizeof(stage));
  frame.remove_prefix(sizeof(stage));
  if (!DecodeLocations(&frame, &tails)) return DataLoss("malformed op frame");
  if (stage != 0) {
    Bytes staged = TakeStage(stage, frame, tails);
    ++(staged.empty() ? unstaged_puts_ : staged_puts_);
    if (!staged.empty()) {
      *body = std::move(staged);
      return Status::Ok();
    }
  }
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
                          std::string_view payload, uint64_t device_ns) {
  return channel_->Send(
      FrameKind::kEvent,
      EncodeEventHead(seq, status, payload.size(), device_ns), payload);
}

Status Executor::CompleteSmall(uint64_t seq, const Status& status,
                               std::string_view payload, uint64_t device_ns) {
  if (payload.size() > kSmallEvent) {
    return InvalidArgument("event payload of " +
                           std::to_string(payload.size()) +
                           " bytes is not small");
  }
  auto owned = std::make_shared<std::string>(payload);
  std::vector<Channel::Frame> frames;
  frames.push_back(Channel::Frame{
      FrameKind::kEvent,
      EncodeEventHead(seq, status, owned->size(), device_ns),
      std::string_view(*owned)});
  return channel_->SendMany(std::move(frames), std::move(owned));
}

size_t Executor::backlog() {
  std::lock_guard<std::mutex> lock(mu_);
  return reorder_.size();
}

std::vector<Executor::Loss> Executor::PendingLosses() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Loss> losses;
  for (const Op& notice : notices_) {
    losses.push_back(Loss{notice.program, notice.seq,
                          std::string(notice.payload.view())});
  }
  return losses;
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
