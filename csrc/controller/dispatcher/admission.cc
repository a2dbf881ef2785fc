// Which held gang is numbered next (Dispatcher::AdmitHeld): FairShare's
// pick among the gangs whose islands have room in their in-flight window
// and their memory budget, and the memory each numbered op's results take
// (the budget a client's results hold on an island, freed by their DELETE).
// A gang that can never fit is refused with words that say what to do.
#include "controller/dispatcher/dispatcher.h"

#include <chrono>
#include <cstdio>
#include <string>

namespace jax_pathways {
namespace {

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

Status Dispatcher::NeverFits(const IslandOp& io, const Island& island) const {
  if (island.capacity == 0) return Status::Ok();
  int64_t need = 0;
  for (int64_t b : io.result_bytes) need += b;
  if (need <= island.capacity) return Status::Ok();
  return Status(Code::kResourceExhausted,
                "out of device memory: the results need " + Size(need) +
                    " on island " + std::to_string(io.island) + " (" +
                    island.name + "), which has " + Size(island.capacity) +
                    " in all; use more devices or smaller arrays");
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
      GangSlot slot{held.gang, i, op.kind == OpKind::kLaunch, client, 0, now,
                    op.program};
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

}  // namespace jax_pathways
