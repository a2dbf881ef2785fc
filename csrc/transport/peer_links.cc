#include "transport/peer_links.h"

#include <chrono>

#include "common/thread_name.h"
#include "transport/messages.h"

namespace jax_pathways {

PeerLinks::~PeerLinks() { Shutdown(); }

int PeerLinks::Add(int fd, std::string peer_name) {
  auto link = std::make_unique<Link>();
  link->name = std::move(peer_name);
  link->channel = std::make_shared<Channel>(fd);
  Link* raw = link.get();
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return -1;  // `link` closes the fd
  links_.push_back(std::move(link));
  raw->reader = std::thread([this, raw] {
    NameThisThread("jp-peer-in");
    ReadLoop(raw);
  });
  return static_cast<int>(links_.size()) - 1;
}

PeerLinks::Link* PeerLinks::Find(int link) {
  if (link < 0 || static_cast<size_t>(link) >= links_.size()) return nullptr;
  return links_[link].get();
}

void PeerLinks::ReadLoop(Link* link) {
  while (true) {
    FrameKind kind;
    Bytes body;
    Status s = link->channel->Receive(&kind, &body);
    Event event;
    if (s.ok() && kind != FrameKind::kTransfer) {
      s = DataLoss("peer sent a frame of kind " +
                   std::to_string(static_cast<uint32_t>(kind)));
    }
    if (s.ok()) s = DecodeEvent(body, &event);
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok()) {
      link->dead =
          Unavailable("link to worker " + link->name + " lost: " + s.message());
      cv_.notify_all();
      return;
    }
    if (event.status.ok()) {
      link->arrived.emplace(event.seq, std::move(event.payload));
    } else {
      link->arrived.emplace(event.seq, event.status);
    }
    cv_.notify_all();
  }
}

Status PeerLinks::Send(int link_id, uint64_t transfer_id, const Status& status,
                       std::string_view data) {
  std::shared_ptr<Channel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Link* link = Find(link_id);
    if (link == nullptr) return NotFound("no peer link " + std::to_string(link_id));
    if (!link->dead.ok()) return link->dead;
    channel = link->channel;
  }
  return channel->Send(FrameKind::kTransfer,
                       EncodeEventHead(transfer_id, status, data.size()), data);
}

StatusOr<Bytes> PeerLinks::Receive(int link_id, uint64_t transfer_id,
                                   double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  Link* link = Find(link_id);
  if (link == nullptr) return NotFound("no peer link " + std::to_string(link_id));
  auto ready = [&] {
    return link->arrived.count(transfer_id) || !link->dead.ok() || shut_down_;
  };
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready)) {
    return DeadlineExceeded("transfer " + std::to_string(transfer_id) +
                            " from worker " + link->name + " did not arrive");
  }
  auto it = link->arrived.find(transfer_id);
  if (it == link->arrived.end()) {
    return shut_down_ ? Cancelled("worker is shutting down") : link->dead;
  }
  StatusOr<Bytes> out = std::move(it->second);
  link->arrived.erase(it);
  return out;
}

void PeerLinks::Shutdown() {
  std::vector<Link*> links;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& l : links_) {
      l->channel->Shutdown();
      links.push_back(l.get());
    }
    cv_.notify_all();
  }
  for (Link* l : links) {
    if (l->reader.joinable()) l->reader.join();
  }
}

}  // namespace jax_pathways
