#include "controller/dispatcher/dispatcher.h"

#include "common/thread_name.h"
#include "transport/local_reads.h"
#include "transport/wire.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
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

bool BrokeLink(const Status& s) {
  return s.code() == Code::kDataLoss &&
         std::string_view(s.message()).substr(0, kBrokenLinkWords.size()) ==
             kBrokenLinkWords;
}

// "600 B", "1.5 MiB": what error messages say of memory.
std::string Size(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  snprintf(text, sizeof(text), unit ? "%.1f %s" : "%.0f %s", value,
           kUnits[unit]);
  return text;
}

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
      if (refusal.ok() && it != islands_.end() && it->second->capacity > 0) {
        int64_t need = 0;
        for (int64_t b : io.result_bytes) need += b;
        if (need > it->second->capacity) {
          refusal = Status(
              Code::kResourceExhausted,
              "out of device memory: the results need " + Size(need) +
                  " on island " + std::to_string(io.island) + " (" +
                  it->second->name + "), which has " +
                  Size(it->second->capacity) +
                  " in all; use more devices or smaller arrays");
        }
      }
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

Status Dispatcher::InputFailure(const IslandOp& io) const {
  // A DELETE frees what it names however it was made: refused, it would
  // leave the good buffers beside a failed one on the worker for good.
  if (io.op.kind == OpKind::kDelete) return Status::Ok();
  Status failed = buffers_.FirstFailure(io.op.args);
  if (failed.ok() && io.fails_with != 0) {
    failed = buffers_.FirstFailure({io.fails_with});
  }
  return failed;
}

bool Dispatcher::Fits(const Held& held) const {
  for (const IslandOp& io : held.ops) {
    auto it = islands_.find(io.island);
    // A dead island takes anything: the gang is failed when admitted.
    if (it == islands_.end() || !it->second->alive) continue;
    const Island& island = *it->second;
    if (io.op.kind == OpKind::kLaunch && !island.queue.HasRoom()) return false;
    if (island.capacity > 0) {
      int64_t need = 0;
      for (int64_t b : io.result_bytes) need += b;
      if (island.used + need > island.capacity) return false;
    }
  }
  return true;
}

const Dispatcher::Island* Dispatcher::ShortOfMemory(const Held& held) const {
  for (const IslandOp& io : held.ops) {
    auto it = islands_.find(io.island);
    if (it == islands_.end() || !it->second->alive ||
        it->second->capacity == 0) {
      continue;
    }
    int64_t need = 0;
    for (int64_t b : io.result_bytes) need += b;
    if (it->second->used + need > it->second->capacity) {
      return it->second.get();
    }
  }
  return nullptr;
}

void Dispatcher::ExpireMemoryWaits(double max_wait_s) {
  Outbox outbox;
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    fair_.DropHeads([&](ClientId client, const Held& held) {
      double waited =
          std::chrono::duration<double>(now - held.since).count();
      const Island* island = ShortOfMemory(held);
      if (island == nullptr || waited <= max_wait_s) return false;
      Refuse(held,
             Status(Code::kResourceExhausted,
                    "out of device memory on island " +
                        std::to_string(island->id) + " (" + island->name +
                        "): waited " + std::to_string(int(waited)) +
                        " s for other clients to free " + Size(island->used) +
                        " of its " + Size(island->capacity) +
                        " (the controller's --memory-wait); try again "
                        "later, or ask for less"),
             &done);
      return true;
    });
    AdmitHeld(&outbox, &done);
  }
  Flush(std::move(outbox), std::move(done));
}

Status Dispatcher::Hopeless(ClientId client, const Held& held) const {
  for (const IslandOp& io : held.ops) {
    auto it = islands_.find(io.island);
    if (it == islands_.end() || it->second->capacity == 0) continue;
    const Island& island = *it->second;
    int64_t need = 0;
    for (int64_t b : io.result_bytes) need += b;
    auto mine = island.used_by.find(client);
    int64_t others = island.used - (mine == island.used_by.end()
                                        ? 0 : mine->second);
    // Only memory other clients hold can be freed while this gang waits: the
    // client's own deletions come after it.
    if (island.used - others + need > island.capacity) {
      return Status(
          Code::kResourceExhausted,
          "out of device memory on island " + std::to_string(io.island) +
              " (" + island.name + "): the results need " + Size(need) +
              " but this client's arrays already hold " +
              Size(island.used - others) + " of its " + Size(island.capacity) +
              "; delete arrays you no longer need (or let them go) first");
    }
  }
  return Status::Ok();
}

void Dispatcher::CountMemory(Island* island, ClientId client,
                             const IslandOp& io) {
  if (io.op.kind == OpKind::kDelete) {
    for (BufferId b : io.op.args) {
      island->made.erase(b);
      auto it = island->held.find(b);
      if (it == island->held.end()) continue;
      island->used -= it->second.second;
      island->used_by[it->second.first] -= it->second.second;
      island->held.erase(it);
    }
    return;
  }
  island->made.insert(io.op.results.begin(), io.op.results.end());
  for (size_t k = 0; k < io.result_bytes.size() && k < io.op.results.size();
       ++k) {
    auto [it, fresh] = island->held.emplace(
        io.op.results[k], std::make_pair(client, io.result_bytes[k]));
    if (!fresh) continue;
    island->used += io.result_bytes[k];
    island->used_by[client] += io.result_bytes[k];
  }
}

void Dispatcher::Refuse(const Held& held, const Status& why,
                        std::vector<Completion>* done) {
  const Gang& gang = *held.gang;
  buffers_.Resolve(gang.results, why, done);
  buffers_.Release(held.inputs);
  if (gang.tag) done->push_back(Completion{gang.tag, why, gang.payloads});
}

void Dispatcher::AdmitHeld(Outbox* outbox, std::vector<Completion>* done) {
  fair_.DropHeads([&](ClientId client, const Held& held) {
    if (Fits(held)) return false;
    Status why = Hopeless(client, held);
    if (why.ok()) return false;
    Refuse(held, why, done);
    return true;
  });
  while (auto next = fair_.Next([this](const Held& h) { return Fits(h); })) {
    auto& [client, held] = *next;
    Status refusal;
    for (const IslandOp& io : held.ops) {
      auto it = islands_.find(io.island);
      if (it == islands_.end() || !it->second->alive) {  // died meanwhile
        refusal = it == islands_.end() ? Unavailable("island is gone")
                                       : it->second->death;
        break;
      }
      // An input that failed while this waited (e.g. refused for memory).
      refusal = InputFailure(io);
      if (!refusal.ok()) break;
    }
    if (!refusal.ok()) {
      Refuse(held, refusal, done);
      fair_.DropIfDone(client);
      continue;
    }
    auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < held.ops.size(); ++i) {
      Island* island = islands_.at(held.ops[i].island).get();
      CountMemory(island, client, held.ops[i]);
      Op op = std::move(held.ops[i].op);
      op.seq = order_.Next(island->id);
      GangSlot slot{held.gang, i, op.kind == OpKind::kLaunch, client, 0, now};
      if (slot.is_launch) slot.estimate = fair_.Started(client);
      std::vector<Op> ready;
      island->queue.Push(std::move(op), std::move(slot), &ready);
      ++island->submitted;
      Admitted(island, std::move(ready), outbox, done);
    }
    buffers_.Release(held.inputs);
    fair_.DropIfDone(client);
  }
}

void Dispatcher::SetWeight(ClientId client, double weight) {
  std::lock_guard<std::mutex> lock(mu_);
  fair_.SetWeight(client, weight);
}

void Dispatcher::ForgetClient(ClientId client) {
  std::lock_guard<std::mutex> lock(mu_);
  fair_.Forget(client);
}

std::vector<ClientShare> Dispatcher::Shares() {
  std::lock_guard<std::mutex> lock(mu_);
  return fair_.Shares();
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

JpUploadStream Dispatcher::StreamUpload(uint64_t stage,
                                        std::vector<StageDest> dests) {
  return MakeUploadStream(stage_sink_, stage, std::move(dests));
}

void Dispatcher::Island::EndSentStage(uint64_t stage) {
  refused_stages.erase(stage);
  auto it = sent_stages.find(stage);
  if (it == sent_stages.end()) return;
  sent_stage_bytes -= it->second.total;
  sent_stages.erase(it);
}

bool Dispatcher::Island::SentStage::Holds(
    const std::vector<Bytes>& tails) const {
  if (sent != total || tails.size() != pieces.size()) return false;
  auto piece = pieces.begin();
  uint64_t offset = 0;
  for (const Bytes& t : tails) {
    if (piece->first != offset || piece->second.data() != t.data() ||
        piece->second.size() != t.size()) {
      return false;
    }
    offset += t.size();
    ++piece;
  }
  return true;
}

void Dispatcher::Stage(uint64_t stage, const std::vector<StageDest>& dests,
                       uint64_t offset,
                       const std::vector<std::string_view>& pieces,
                       std::shared_ptr<const void> owner) {
  uint64_t bytes = 0;
  for (std::string_view p : pieces) bytes += p.size();
  struct To {
    std::shared_ptr<Channel> channel;
    std::string head;  // stage, total, offset in it
    bool with_bytes;
  };
  std::vector<To> to;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const StageDest& dest : dests) {
      auto it = islands_.find(dest.island);
      if (it == islands_.end() || !it->second->alive) {
        continue;  // its PUT fails with the island
      }
      Island& island = *it->second;
      const uint64_t at = dest.base + offset;
      if (at > dest.total || bytes > dest.total - at) {
        continue;  // more than the request declared: its check refuses it
      }
      WireWriter head;
      head.U64(stage);
      head.U64(dest.total);
      head.U64(at);
      auto sent = island.sent_stages.find(stage);
      if (sent == island.sent_stages.end() && island.reads_locally) {
        island.staged_bytes += bytes;
        to.push_back(To{island.channel, head.Take(), false});
        continue;
      }
      if (sent == island.sent_stages.end()) {
        // The worker makes room for all of it at once, however little a
        // client then sends.
        if (island.refused_stages.count(stage)) continue;
        if (island.sent_stages.size() >= kMaxStages ||
            dest.total > kMaxSentStageBytes - island.sent_stage_bytes) {
          island.refused_stages.insert(stage);
          continue;  // its PUT comes with the bytes
        }
        sent = island.sent_stages.emplace(stage, Island::SentStage()).first;
        sent->second.total = dest.total;
        island.sent_stage_bytes += dest.total;
      }
      Island::SentStage& s = sent->second;
      if (dest.total != s.total) continue;  // a bug
      uint64_t piece_at = at;
      for (std::string_view p : pieces) {
        s.pieces.emplace(piece_at, p);
        piece_at += p.size();
      }
      s.sent += bytes;
      island.staged_bytes += bytes;
      to.push_back(To{island.channel, head.Take(), true});
    }
  }
  for (To& t : to) {
    std::vector<Channel::Frame> frames;
    if (t.with_bytes) {
      frames.push_back(
          Channel::Frame{FrameKind::kStageData, std::move(t.head), {}, pieces});
      // The channel's writer thread copies the bytes into the socket, not
      // the gRPC thread, which receives every client's requests.
      t.channel->SendMany(std::move(frames), owner, /*now=*/false);
    } else {
      frames.push_back(Channel::Frame{FrameKind::kStage,
                                      t.head + EncodeLocations(pieces), {}});
      t.channel->SendMany(std::move(frames), nullptr);
    }
  }
}

void Dispatcher::Unstage(const std::vector<IslandId>& islands,
                         uint64_t stage) {
  WireWriter head;
  head.U64(stage);
  const std::string frame = head.Take();
  std::vector<std::shared_ptr<Channel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (IslandId id : islands) {
      auto it = islands_.find(id);
      if (it == islands_.end() || !it->second->alive) continue;
      Island& island = *it->second;
      const bool held = island.sent_stages.count(stage) > 0;
      island.EndSentStage(stage);
      if (held || island.reads_locally) channels.push_back(island.channel);
    }
  }
  for (const std::shared_ptr<Channel>& c : channels) {
    std::vector<Channel::Frame> frames;
    frames.push_back(Channel::Frame{FrameKind::kUnstage, frame, {}});
    c->SendMany(std::move(frames), nullptr);
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

void Dispatcher::ExpireSilentIslands(double timeout_s) {
  Outbox outbox;
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    for (auto& [id, island] : islands_) {
      if (!island->alive) continue;
      double silent =
          std::chrono::duration<double>(now - island->last_heard).count();
      if (silent <= timeout_s) continue;
      char seconds[32];
      snprintf(seconds, sizeof(seconds), "%.1f", silent);
      KillLocked(island.get(),
                 DataLoss("worker " + island->name + " is lost: it sent "
                          "nothing, not even a heartbeat, for " + seconds +
                          " s (stopped or wedged; the controller's "
                          "--worker-timeout)"),
                 &outbox, &done);
    }
  }
  Flush(std::move(outbox), std::move(done));
}

void Dispatcher::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shut_down_) {
    std::vector<std::shared_ptr<Channel>> channels;
    for (auto& [id, island] : islands_) {
      if (island->alive) channels.push_back(island->channel);
    }
    lock.unlock();
    for (const std::shared_ptr<Channel>& channel : channels) {
      // Never blocks: what the socket does not take waits in the channel's
      // queue (a frozen worker is lost by its own silence meanwhile).
      std::vector<Channel::Frame> beat;
      beat.push_back(Channel::Frame{FrameKind::kHeartbeat, {}, {}});
      channel->SendMany(std::move(beat), nullptr);
    }
    channels.clear();
    lock.lock();
    shutting_down_.wait_for(lock, kHeartbeatInterval,
                            [this] { return shut_down_; });
    if (held_failures_.empty()) continue;
    std::vector<Completion> done;
    EndHeldExpired(&done);
    lock.unlock();
    Publish(std::move(done));
    lock.lock();
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

bool Dispatcher::AwaitsCause(const Gang& g, Status* cause) const {
  Status unused;
  for (BufferId id : g.inputs) {
    if (buffers_.State(id, &unused) == BufferState::kPending) return true;
  }
  Status failed = buffers_.FirstFailure(g.inputs);
  if (!failed.ok() && !BrokeLink(failed)) {
    *cause = failed;
    return false;
  }
  *cause = g.status;
  return g.islands.size() > 1;
}

void Dispatcher::Finish(Gang& g, std::vector<Completion>* done) {
  g.done = true;
  buffers_.Resolve(g.results, g.status, done);
  if (g.tag) done->push_back(Completion{g.tag, g.status, std::move(g.payloads)});
}

void Dispatcher::EndHeldOn(const Island& island, const Status& why,
                           std::vector<Completion>* done) {
  for (HeldFailure& h : TakeHeld([&](const HeldFailure& h) {
         const std::vector<IslandId>& on = h.gang->islands;
         return std::find(on.begin(), on.end(), island.id) != on.end();
       })) {
    h.gang->status = why;
    EndHeld(h, done);
  }
  EndHeldByInputs(done);
}

void Dispatcher::EndHeldExpired(std::vector<Completion>* done) {
  const auto now = std::chrono::steady_clock::now();
  for (HeldFailure& h :
       TakeHeld([&](const HeldFailure& h) { return h.until <= now; })) {
    EndHeld(h, done);
  }
  EndHeldByInputs(done);
}

void Dispatcher::EndHeldByInputs(std::vector<Completion>* done) {
  for (size_t i = 0; i < held_failures_.size();) {
    Status cause;
    if (AwaitsCause(*held_failures_[i].gang, &cause)) {
      ++i;
      continue;
    }
    HeldFailure h = std::move(held_failures_[i]);
    held_failures_.erase(held_failures_.begin() + i);
    h.gang->status = cause;
    EndHeld(h, done);
    i = 0;  // its results may be the inputs an earlier one waits for
  }
}

void Dispatcher::EndHeld(HeldFailure& h, std::vector<Completion>* done) {
  buffers_.Release(h.gang->inputs);
  Finish(*h.gang, done);
}

std::vector<Dispatcher::HeldFailure> Dispatcher::TakeHeld(
    const std::function<bool(const HeldFailure&)>& which) {
  std::vector<HeldFailure> taken, kept;
  for (HeldFailure& h : held_failures_) {
    (which(h) ? taken : kept).push_back(std::move(h));
  }
  held_failures_ = std::move(kept);
  return taken;
}

void Dispatcher::KillLocked(Island* island, const Status& why,
                            Outbox* outbox, std::vector<Completion>* done) {
  if (!island->alive) return;
  ++epoch_;
  island->alive = false;
  island->death = why;
  island->last_lost = why.message();
  island->last_lost_at = std::chrono::duration<double>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  island->channel->Shutdown();
  island->lent.clear();
  island->sent_stages.clear();
  island->refused_stages.clear();
  island->sent_stage_bytes = 0;
  for (GangSlot& slot : island->queue.DrainAll()) {
    ++island->finished;
    if (slot.is_launch) fair_.Abandoned(slot.client);
    Gang& g = *slot.gang;
    // The loss is why a program spanning this island failed, even where
    // another island's part reported first: its collectives broke when
    // this worker went, and the user must learn which worker that was.
    if (!g.done) g.status = why;
    if (!g.done && g.remaining > 1) {
      // Its ops on other islands cannot succeed: fail the gang now rather
      // than when they give up.
      g.done = true;
      buffers_.Resolve(g.results, why, done);
      if (g.tag) {
        done->push_back(Completion{g.tag, why, std::move(g.payloads)});
      }
    }
    FinishSlot(slot, why, {}, done);
  }
  EndHeldOn(*island, why, done);
  // What it held is gone, whoever holds the rest of an array; so are views
  // of it (shards, assembled arrays), which a new worker for the island
  // would not know.
  std::vector<BufferId> held(island->made.begin(), island->made.end());
  for (const auto& [id, owner] : island->held) {
    if (!island->made.count(id)) held.push_back(id);
  }
  buffers_.Resolve(held, why, done);
  for (auto& [id, other] : islands_) {
    if (!other->alive) continue;
    Op notice;
    notice.kind = OpKind::kPeerLost;
    notice.seq = order_.Last(other->id);  // its ops numbered before the loss
    notice.program = static_cast<uint64_t>(island->id);
    notice.payload = Bytes::Copy(why.message());
    outbox->push_back(Outgoing{other->channel, std::move(notice)});
  }
  AdmitHeld(outbox, done);  // held gangs for this island fail now
}

void Dispatcher::NoteLoss(IslandId island, const std::string& note) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = islands_.find(island);
  if (it == islands_.end() || it->second->alive) return;
  Island& lost = *it->second;
  lost.death = Status(lost.death.code(), lost.death.message() + note);
  lost.last_lost = lost.death.message();
}

void Dispatcher::FailIsland(IslandId island, const Status& why) {
  Outbox outbox;
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = islands_.find(island);
    if (it == islands_.end()) return;
    KillLocked(it->second.get(), why, &outbox, &done);
  }
  Flush(std::move(outbox), std::move(done));
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
