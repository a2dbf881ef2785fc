#include "controller/dispatcher/dispatcher.h"

#include "common/thread_name.h"
#include "transport/local_reads.h"
#include "transport/wire.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>

namespace jax_pathways {
namespace {

// Completion tags of C++ callbacks (WhenReady with a function); Python's
// count up from 1 and never reach it.
constexpr uint64_t kNativeTag = uint64_t{1} << 63;

// Payload tails (uploads) from this size on (all of an op's together) are
// lent to a worker on this
// host, which reads them from our memory: one copy instead of the socket's
// two. Below it the socket's copies are cheaper than the extra syscall.
constexpr size_t kLentTailMin = size_t{64} << 10;

// How long a gang failed by a broken link between workers waits for the
// loss behind it (Dispatcher::held_failures_): a killed worker's connection
// ends within milliseconds; a stopped one is lost by its silence, later,
// and its gang then says only that the link broke.
constexpr auto kLossNoticeWait = std::chrono::seconds(2);

}  // namespace
Dispatcher::Dispatcher(int max_in_flight) : max_in_flight_(max_in_flight) {
  heartbeat_ = std::thread([this] {
    NameThisThread("jp-heartbeat");
    HeartbeatLoop();
  });
}

Dispatcher::~Dispatcher() {
  stage_sink_->Detach();
  Shutdown();
}

Status Dispatcher::AddIsland(IslandId island, int fd, std::string name,
                             int64_t memory_bytes) {
  auto channel = std::make_shared<Channel>(fd);
  // A lost island's last worker: its reader thread has ended or is ending
  // (KillLocked shut its channel down) and is joined outside mu_, which it
  // may be waiting for.
  std::unique_ptr<Island> lost;
  Island* raw = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) {
      channel->Shutdown();
      return Unavailable("dispatcher is shut down");
    }
    auto it = islands_.find(island);
    if (it != islands_.end() && it->second->alive) {
      channel->Shutdown();
      return Status(Code::kAlreadyExists,
                    "island " + std::to_string(island) + " already has a worker");
    }
    auto owned = std::make_unique<Island>(island, std::move(name),
                                          std::move(channel), max_in_flight_,
                                          memory_bytes);
    raw = owned.get();
    if (it != islands_.end()) {
      // Its next generation. Everything numbered for the old worker has
      // finished (failed) in KillLocked, and gangs naming a dead island were
      // refused, so nothing carries over but the record of the loss.
      lost = std::move(it->second);
      ++epoch_;
      raw->restarts = lost->restarts + 1;
      raw->last_lost = lost->last_lost;
      raw->last_lost_at = lost->last_lost_at;
      it->second = std::move(owned);
      order_.Restart(island);
    } else {
      islands_.emplace(island, std::move(owned));
    }
    if (raw->channel->IsLocal()) {
      // The reader thread takes the answer; until then tails are sent.
      std::vector<Channel::Frame> probe;
      probe.push_back(Channel::Frame{FrameKind::kReadProbe,
                                     EncodeLocation(kReadProbePattern), {}});
      raw->channel->SendMany(std::move(probe), nullptr);
    }
    raw->reader = std::thread([this, raw] {
      NameThisThread("jp-island" + std::to_string(raw->id));
      ReadLoop(raw);
    });
  }
  if (lost && lost->reader.joinable()) lost->reader.join();
  return Status::Ok();
}

void Dispatcher::Submit(std::vector<IslandOp> gang, uint64_t tag,
                        ClientId client) {
  Outbox outbox;
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto g = std::make_shared<Gang>();
    g->tag = tag;
    g->remaining = gang.size();
    g->payloads.resize(gang.size());
    for (const IslandOp& io : gang) {
      g->results.insert(g->results.end(), io.op.results.begin(),
                        io.op.results.end());
      g->islands.push_back(io.island);
      if (io.op.kind == OpKind::kDelete) continue;
      g->inputs.insert(g->inputs.end(), io.op.args.begin(), io.op.args.end());
      if (io.fails_with != 0) g->inputs.push_back(io.fails_with);
    }
    buffers_.AddPending(g->results);

    // Decide before numbering anything: a gang is placed whole or not at all,
    // so no island ever waits for a sequence number that never comes.
    Status refusal;
    std::set<IslandId> seen;
    for (const IslandOp& io : gang) {
      auto it = islands_.find(io.island);
      if (shut_down_) {
        refusal = Unavailable("the controller is shutting down");
      } else if (it == islands_.end()) {
        refusal = NotFound("island " + std::to_string(io.island) +
                           " does not exist");
      } else if (!it->second->alive) {
        refusal = it->second->death;
      } else if (!seen.insert(io.island).second) {
        refusal = InvalidArgument("gang names island " +
                                  std::to_string(io.island) + " twice");
      } else {
        refusal = InputFailure(io);
      }
      if (refusal.ok()) refusal = NeverFits(io, *it->second);
      if (!refusal.ok()) break;
    }
    if (gang.empty()) refusal = InvalidArgument("empty gang");
    if (!refusal.ok()) {
      buffers_.Resolve(g->results, refusal, &done);
      if (tag) done.push_back(Completion{tag, refusal, g->payloads});
    } else {
      fair_.Push(client, Held{g, std::move(gang),
                              std::chrono::steady_clock::now(), {}});
      AdmitHeld(&outbox, &done);
      // Most gangs are numbered at once; one that still waits keeps its
      // inputs known until it is (the caller may forget them next).
      Held* waiting = fair_.LastWaiting(client);
      if (waiting != nullptr && waiting->gang == g) {
        for (const IslandOp& io : waiting->ops) {
          waiting->inputs.insert(waiting->inputs.end(), io.op.args.begin(),
                                 io.op.args.end());
          if (io.fails_with != 0) waiting->inputs.push_back(io.fails_with);
        }
        buffers_.Hold(waiting->inputs);
      }
    }
  }
  Flush(std::move(outbox), std::move(done));
}

void Dispatcher::Flush(Outbox outbox, std::vector<Completion> done) {
  if (!outbox.empty()) {
    std::unique_lock<std::mutex> lock(cork_mu_);
    if (corks_ > 0) {
      for (auto& item : outbox) held_.push_back(std::move(item));
    } else {
      lock.unlock();
      SendNow(std::move(outbox));
    }
  }
  Publish(std::move(done));
}

void Dispatcher::Publish(std::vector<Completion> done) {
  for (Completion& c : done) {
    if (!(c.tag & kNativeTag)) {
      completions_.Push(std::move(c));
      continue;
    }
    std::function<void(Completion)> callback;
    {
      std::lock_guard<std::mutex> lock(native_mu_);
      auto it = native_.find(c.tag);
      if (it == native_.end()) continue;
      callback = std::move(it->second);
      native_.erase(it);
    }
    callback(std::move(c));
  }
}

void Dispatcher::SendNow(Outbox outbox) {
  // One batch per channel, in order. The channel may write it later (a
  // worker that does not read): the batch's ops own the bytes its frames
  // point to until then.
  size_t i = 0;
  while (i < outbox.size()) {
    std::shared_ptr<Channel> channel = outbox[i].channel;
    auto ops = std::make_shared<std::vector<Op>>();
    std::vector<Channel::Frame> frames;
    for (; i < outbox.size() && outbox[i].channel == channel; ++i) {
      const Outgoing::Tails how = outbox[i].tails;
      const Op& op = ops->emplace_back(std::move(outbox[i].op));
      WireWriter stage;
      stage.U64(op.stage);
      if (how == Outgoing::Tails::kStaged) {
        frames.push_back(Channel::Frame{FrameKind::kOpStaged,
                                        stage.Take() + EncodeOpHead(op),
                                        op.payload.view()});
        continue;
      }
      std::vector<std::string_view> tails;
      for (const Bytes& t : op.payload_tails) tails.push_back(t.view());
      if (how == Outgoing::Tails::kLend) {
        frames.push_back(Channel::Frame{
            FrameKind::kOpLocal,
            stage.Take() + EncodeLocations(tails) + EncodeOpHead(op),
            op.payload.view()});
        continue;
      }
      if (op.stage != 0) {  // sent whole: the stage is not needed
        frames.push_back(Channel::Frame{FrameKind::kUnstage, stage.Take(),
                                        {}});
      }
      frames.push_back(Channel::Frame{FrameKind::kOp, EncodeOpHead(op),
                                      op.payload.view(), std::move(tails)});
    }
    // A failed write closes the channel: its reader thread sees the broken
    // connection and fails the island's ops.
    channel->SendMany(std::move(frames), std::move(ops));
  }
}

void Dispatcher::Cork() {
  std::lock_guard<std::mutex> lock(cork_mu_);
  ++corks_;
}

void Dispatcher::Uncork() {
  Outbox held;
  {
    std::lock_guard<std::mutex> lock(cork_mu_);
    if (corks_ == 0 || --corks_ > 0) return;
    held.swap(held_);
  }
  SendNow(std::move(held));
}

void Dispatcher::ReadLoop(Island* island) {
  std::shared_ptr<Channel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    channel = island->channel;
  }
  while (true) {
    FrameKind kind;
    Bytes body;
    Status s = channel->Receive(&kind, &body);
    if (s.ok() && kind == FrameKind::kHeartbeat) {
      std::lock_guard<std::mutex> lock(mu_);
      island->last_heard = std::chrono::steady_clock::now();
      continue;
    }
    if (s.ok() && kind == FrameKind::kReadProbeAck) {
      uint32_t can = 0;
      WireReader answer(body.view());
      if (answer.U32(&can)) {
        std::lock_guard<std::mutex> lock(mu_);
        island->last_heard = std::chrono::steady_clock::now();
        island->reads_locally = can == 1;
        continue;
      }
      s = DataLoss("malformed probe answer");
    }
    Event event;
    if (s.ok() && kind != FrameKind::kEvent) {
      s = DataLoss("worker sent a frame of kind " +
                   std::to_string(static_cast<uint32_t>(kind)));
    }
    if (s.ok()) s = DecodeEvent(body, &event);
    if (!s.ok()) {
      Outbox outbox;
      std::vector<Completion> done;
      {
        std::lock_guard<std::mutex> lock(mu_);
        KillLocked(island,
                   DataLoss("worker " + island->name + " is lost: " +
                            s.message()),
                   &outbox, &done);
      }
      Flush(std::move(outbox), std::move(done));
      return;
    }
    HandleEvent(island, std::move(event));
  }
}

void Dispatcher::HandleEvent(Island* island, Event event) {
  Outbox outbox;
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!island->alive) return;
    island->last_heard = std::chrono::steady_clock::now();
    std::vector<Op> ready;
    std::optional<GangSlot> slot = island->queue.Finish(event.seq, &ready);
    if (!slot) {
      KillLocked(island,
                 DataLoss("worker " + island->name + " finished op " +
                          std::to_string(event.seq) + " that was never sent"),
                 &outbox, &done);
    } else {
      ++island->finished;
      island->lent.erase(event.seq);
      if (slot->is_launch) {
        // What the worker measured; else the island was this launch's from
        // when it was sent or the previous launch finished, whichever is
        // later.
        auto now = std::chrono::steady_clock::now();
        auto began = std::max(slot->sent, island->last_finish);
        island->last_finish = now;
        fair_.Finished(
            slot->client,
            event.device_ns > 0
                ? static_cast<double>(event.device_ns) * 1e-9
                : std::chrono::duration<double>(now - began).count(),
            slot->estimate);
      }
      FinishSlot(*slot, event.status, std::move(event.payload), &done);
      EndHeldByInputs(&done);
      Admitted(island, std::move(ready), &outbox, &done);
      AdmitHeld(&outbox, &done);
    }
  }
  Flush(std::move(outbox), std::move(done));
}

void Dispatcher::Admitted(Island* island, std::vector<Op> ready, Outbox* outbox,
                          std::vector<Completion>* done) {
  for (size_t i = 0; i < ready.size(); ++i) {
    if (!ExpectsEvent(ready[i].kind)) {
      if (std::optional<GangSlot> slot =
              island->queue.Finish(ready[i].seq, &ready)) {
        ++island->finished;
        FinishSlot(*slot, Status::Ok(), {}, done);
      }
    }
    Op& op = ready[i];
    auto how = Outgoing::Tails::kSend;
    // A tail is lent only to an op that reports back: its event says the
    // worker is done with our memory.
    if (island->reads_locally && ExpectsEvent(op.kind) &&
        op.TailBytes() >= kLentTailMin) {
      how = Outgoing::Tails::kLend;
      island->lent.emplace(op.seq, op.payload_tails);
    }
    if (op.stage != 0) {
      auto sent = island->sent_stages.find(op.stage);
      if (sent != island->sent_stages.end()) {
        if (how == Outgoing::Tails::kSend &&
            sent->second.Holds(op.payload_tails)) {
          how = Outgoing::Tails::kStaged;
        }
        island->EndSentStage(op.stage);
      } else if (!island->reads_locally) {
        island->EndSentStage(op.stage);  // a refused one
        op.stage = 0;  // nothing of it went there: no stage to end
      }
    }
    outbox->push_back(Outgoing{island->channel, std::move(op), how});
  }
}

void Dispatcher::FinishSlot(const GangSlot& slot, const Status& status,
                            Bytes payload,
                            std::vector<Completion>* done) {
  Gang& g = *slot.gang;
  --g.remaining;
  if (g.done) return;  // failed already, when one of its islands was lost
  g.payloads[slot.index] = std::move(payload);
  if (!status.ok() && g.status.ok()) g.status = status;
  if (g.remaining > 0) return;
  if (BrokeLink(g.status)) {
    Status cause;
    if (AwaitsCause(g, &cause)) {
      buffers_.Hold(g.inputs);  // kept past the client's destructs
      held_failures_.push_back(HeldFailure{
          slot.gang, std::chrono::steady_clock::now() + kLossNoticeWait});
      return;
    }
    g.status = cause;
  }
  Finish(g, done);
}

void Dispatcher::Finish(Gang& g, std::vector<Completion>* done) {
  g.done = true;
  buffers_.Resolve(g.results, g.status, done);
  if (g.tag) done->push_back(Completion{g.tag, g.status, std::move(g.payloads)});
}

void Dispatcher::WhenReady(const std::vector<BufferId>& ids, uint64_t tag) {
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.WhenReady(ids, tag, &done);
  }
  Publish(std::move(done));
}

void Dispatcher::WhenReady(const std::vector<BufferId>& ids,
                           std::function<void(const Status&)> done) {
  WhenReady(ids, NativeTag([done = std::move(done)](Completion c) {
              done(c.status);
            }));
}

void Dispatcher::Submit(std::vector<IslandOp> gang,
                        std::function<void(Completion)> done,
                        ClientId client) {
  Submit(std::move(gang), NativeTag(std::move(done)), client);
}

uint64_t Dispatcher::NativeTag(std::function<void(Completion)> done) {
  std::lock_guard<std::mutex> lock(native_mu_);
  uint64_t tag = kNativeTag | ++next_native_;
  native_[tag] = std::move(done);
  return tag;
}

std::vector<BufferId> Dispatcher::NewBuffers(size_t n) {
  BufferId first = next_buffer_.fetch_add(n);
  std::vector<BufferId> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = first + i;
  return ids;
}

std::vector<uint64_t> Dispatcher::NewTransfers(size_t n) {
  constexpr int kRandomBits = 38;
  std::vector<uint64_t> ids(n);
  std::lock_guard<std::mutex> lock(random_mu_);
  for (uint64_t& id : ids) {
    uint64_t bits = (uint64_t{random_()} << 32 | random_()) &
                    ((uint64_t{1} << kRandomBits) - 1);
    id = (bits | uint64_t{1} << kRandomBits) << 20;
  }
  return ids;
}

BufferState Dispatcher::State(BufferId id, Status* failure) {
  std::lock_guard<std::mutex> lock(mu_);
  return buffers_.State(id, failure);
}

void Dispatcher::Forget(const std::vector<BufferId>& ids) {
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.Forget(ids, &done);
  }
  Flush({}, std::move(done));
}

std::vector<Completion> Dispatcher::Poll(double timeout_s, size_t max_items) {
  return completions_.Pop(timeout_s, max_items);
}

std::vector<IslandStats> Dispatcher::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<IslandId, size_t> held;
  fair_.ForEachWaiting([&held](const Held& h) {
    for (const IslandOp& io : h.ops) ++held[io.island];
  });
  std::vector<IslandStats> out;
  const auto now = std::chrono::steady_clock::now();
  for (auto& [id, island] : islands_) {
    IslandStats s;
    s.island = id;
    s.name = island->name;
    s.alive = island->alive;
    s.error = island->death.message();
    s.restarts = island->restarts;
    s.last_lost = island->last_lost;
    s.last_lost_at = island->last_lost_at;
    s.queued = island->queue.queued() + held[id];
    s.memory_used = island->used;
    s.memory_capacity = island->capacity;
    s.in_flight = island->queue.in_flight();
    s.unfinished = island->queue.sent_unfinished();
    s.submitted = island->submitted;
    s.finished = island->finished;
    s.reads_locally = island->reads_locally;
    s.lent = island->lent.size();
    s.staged_bytes = island->staged_bytes;
    s.held_stage_bytes = island->sent_stage_bytes;
    s.send_backlog_bytes = island->channel->backlog_bytes();
    if (const GangSlot* running = island->queue.OldestLaunch()) {
      s.running_client = running->client;
      s.running_program = running->program;
      s.running_s = std::chrono::duration<double>(
                        now - std::max(running->sent, island->last_finish))
                        .count();
      s.others_waiting = island->queue.OpsOfOthers(running->client);
    }
    out.push_back(std::move(s));
  }
  return out;
}

size_t Dispatcher::live_buffers() {
  std::lock_guard<std::mutex> lock(mu_);
  return buffers_.size();
}

void Dispatcher::Shutdown() {
  std::vector<Island*> islands;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& [id, island] : islands_) {
      island->channel->Shutdown();
      islands.push_back(island.get());
    }
    shutting_down_.notify_all();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  for (Island* island : islands) {
    if (island->reader.joinable()) island->reader.join();
  }
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (HeldFailure& h : TakeHeld([](const HeldFailure&) { return true; })) {
      EndHeld(h, &done);
    }
  }
  Publish(std::move(done));
  completions_.Close();
}

}  // namespace jax_pathways
