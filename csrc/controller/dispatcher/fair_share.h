// FairShare: whose next gang is numbered when the islands are saturated.
//
// Gangs wait here per client, in the client's order, until every island they
// launch on has room in its in-flight window; among the clients whose next
// gang fits, the one with the least weighted device time goes first
// (start-time fair queuing at gang granularity, like the Pathways paper's
// per-island scheduler). A gang is charged an estimate when it is numbered
// (the client's recent time per launch) and corrected when each launch
// finishes with the time it held its island, divided by the client's weight.
// A client that has been idle restarts at the weighted time of the latest
// gang to go (the scheduler's clock): it banks no credit, so idleness costs
// the others nothing, now or later. With one client everything passes in order, as without it.
// Not thread-safe: the Dispatcher's mutex guards it.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_FAIR_SHARE_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_FAIR_SHARE_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace jax_pathways {

using ClientId = uint64_t;

struct ClientShare {
  ClientId client = 0;
  double weight = 1.0;
  double device_seconds = 0;  // measured, over its lifetime
  size_t waiting = 0;         // gangs not yet numbered
};

template <typename T>
class FairShare {
 public:
  void SetWeight(ClientId c, double weight) {
    clients_[c].weight = weight > 0 ? weight : 1.0;
  }

  void Push(ClientId c, T item) {
    Client& client = clients_[c];
    if (client.waiting.empty() && client.running == 0) {
      client.vtime = std::max(client.vtime, clock_);
    }
    client.waiting.push_back(std::move(item));
  }

  // The last item `c` pushed, if it still waits; else null.
  T* LastWaiting(ClientId c) {
    auto it = clients_.find(c);
    if (it == clients_.end() || it->second.waiting.empty()) return nullptr;
    return &it->second.waiting.back();
  }

  // Takes the next gang of the least-served client whose next gang `fits`.
  template <typename Fits>
  std::optional<std::pair<ClientId, T>> Next(Fits fits) {
    Client* best = nullptr;
    ClientId best_id = 0;
    for (auto& [id, client] : clients_) {
      if (client.waiting.empty() || !fits(client.waiting.front())) continue;
      if (best == nullptr || client.vtime < best->vtime) {
        best = &client;
        best_id = id;
      }
    }
    if (best == nullptr) return std::nullopt;
    clock_ = std::max(clock_, best->vtime);
    T item = std::move(best->waiting.front());
    best->waiting.pop_front();
    return std::make_pair(best_id, std::move(item));
  }

  // Removes each client's next gangs for as long as `drop(client, gang)`
  // says so (it has failed them).
  template <typename Drop>
  void DropHeads(Drop drop) {
    for (auto& [id, client] : clients_) {
      while (!client.waiting.empty() && drop(id, client.waiting.front())) {
        client.waiting.pop_front();
      }
    }
  }

  // A launch of `c` is sent: charges (and returns) its estimated time.
  double Started(ClientId c) {
    Client& client = clients_[c];
    ++client.running;
    client.vtime += client.per_launch / client.weight;
    return client.per_launch;
  }
  // ... and finished after holding its island `seconds`.
  void Finished(ClientId c, double seconds, double estimate) {
    Client& client = clients_[c];
    if (client.running > 0) --client.running;
    client.vtime += (seconds - estimate) / client.weight;
    client.device_seconds += seconds;
    client.per_launch = client.per_launch == 0
                            ? seconds
                            : 0.8 * client.per_launch + 0.2 * seconds;
    DropIfDone(c);
  }

  // ... or was failed unfinished (its island died): nothing measured.
  void Abandoned(ClientId c) {
    Client& client = clients_[c];
    if (client.running > 0) --client.running;
    DropIfDone(c);
  }

  // The client is gone (its session ended): dropped once nothing of it
  // waits or runs.
  void Forget(ClientId c) {
    auto it = clients_.find(c);
    if (it == clients_.end()) return;
    it->second.forgotten = true;
    DropIfDone(c);
  }

  // Drops a forgotten client with nothing waiting or running (after its last
  // gang was numbered, or its last launch finished).
  void DropIfDone(ClientId c) {
    auto it = clients_.find(c);
    if (it != clients_.end() && it->second.forgotten &&
        it->second.waiting.empty() && it->second.running == 0) {
      clients_.erase(it);
    }
  }

  template <typename F>
  void ForEachWaiting(F f) const {
    for (const auto& [id, client] : clients_) {
      for (const T& item : client.waiting) f(item);
    }
  }

  std::vector<ClientShare> Shares() const {
    std::vector<ClientShare> out;
    for (const auto& [id, client] : clients_) {
      out.push_back(ClientShare{id, client.weight, client.device_seconds,
                                client.waiting.size()});
    }
    return out;
  }

 private:
  struct Client {
    double weight = 1.0;
    double vtime = 0;        // weighted device time received
    double per_launch = 0;   // recent seconds per launch: the estimate
    double device_seconds = 0;
    int running = 0;         // launches numbered, not finished
    bool forgotten = false;  // its session has ended
    std::deque<T> waiting;
  };


  // The weighted time of the latest gang to go: where a client that has
  // been idle starts again.
  double clock_ = 0;
  std::map<ClientId, Client> clients_;  // ordered: ties go to the oldest id
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_DISPATCHER_FAIR_SHARE_H_
