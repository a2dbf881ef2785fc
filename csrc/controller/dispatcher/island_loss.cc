// Liveness and loss: the heartbeat thread (tells every live worker that
// the controller still runs, and ends the held failures past their time),
// islands silent past the worker timeout, and a lost island
// (KillLocked): everything it held and every gang it was part of fails
// with its DATA_LOSS, and the other islands are told (PEER_LOST). Gangs
// failed only by a broken link between workers are held a while for the
// loss behind it, whose words name the worker (held_failures_).
#include "controller/dispatcher/dispatcher.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace jax_pathways {

void Dispatcher::ExpireSilentIslands(double timeout_s) {
  Outbox outbox;
  std::vector<Completion> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    for (auto& [id, island] : islands_) {
      if (!island->alive) continue;
      // Bytes of a frame still arriving count: a long fetch is no silence.
      double silent =
          std::chrono::duration<double>(
              now - std::max(island->last_heard,
                             island->channel->LastReceived()))
              .count();
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

}  // namespace jax_pathways
