#include "transport/peer_links.h"

#include <chrono>

#include "common/thread_name.h"
#include "transport/local_reads.h"
#include "transport/messages.h"

namespace jax_pathways {
namespace {

// Below this, the socket's two copies cost less than the ack round trip.
constexpr size_t kLocalTransferMin = size_t{1} << 20;

}  // namespace

PeerLinks::~PeerLinks() { Shutdown(); }

int PeerLinks::Add(int fd, std::string peer_name) {
  auto link = std::make_unique<Link>();
  link->name = std::move(peer_name);
  link->channel = std::make_shared<Channel>(fd);
  link->local_reads = link->channel->IsLocal();
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
    if (s.ok() && kind != FrameKind::kTransfer &&
        kind != FrameKind::kTransferLocal && kind != FrameKind::kTransferAck) {
      s = DataLoss("peer sent a frame of kind " +
                   std::to_string(static_cast<uint32_t>(kind)));
    }
    if (s.ok()) s = DecodeEvent(body, &event);
    if (s.ok() && kind == FrameKind::kTransferLocal) {
      Bytes copied;
      Status copy = CopyLocal(event, &copied);
      if (copy.ok()) {
        event.payload = std::move(copied);
      }
      // Acknowledged before it is visible: the sender's memory is no longer
      // needed either way, and a refused copy is sent again as bytes.
      s = link->channel->Send(FrameKind::kTransferAck,
                              EncodeEventHead(event.seq, copy, 0), {});
      if (s.ok() && !copy.ok()) continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok()) {
      if (link->dead.ok()) {  // else Close() said why
        link->dead = Unavailable("link to worker " + link->name +
                                 " lost: " + s.message());
      }
      cv_.notify_all();
      return;
    }
    if (kind == FrameKind::kTransferAck) {
      link->acks.emplace(event.seq, event.status);
    } else if (event.status.ok()) {
      link->arrived.emplace(event.seq, std::move(event.payload));
    } else {
      link->arrived.emplace(event.seq, event.status);
    }
    cv_.notify_all();
  }
}

Status PeerLinks::CopyLocal(const Event& event, Bytes* out) {
  std::string_view in = event.payload.view();
  Location where;
  if (!DecodeLocation(&in, &where) || !in.empty()) {
    return DataLoss("malformed local transfer");
  }
  char* w;
  StatusOr<Bytes> buffer = Bytes::Allocate(where.size, &w);
  if (!buffer.ok()) return buffer.status();
  *out = std::move(buffer.value());
  return ReadLocation(where, w);
}

StatusOr<bool> PeerLinks::SendLocal(Link* link, uint64_t transfer_id,
                                    std::string_view data) {
  std::shared_ptr<Channel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    channel = link->channel;
  }
  std::string payload = EncodeLocation(data);
  Status s = channel->Send(
      FrameKind::kTransferLocal,
      EncodeEventHead(transfer_id, Status::Ok(), payload.size()), payload);
  if (!s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    return link->acks.count(transfer_id) || !link->dead.ok() || shut_down_;
  });
  auto it = link->acks.find(transfer_id);
  if (it == link->acks.end()) {
    return shut_down_ ? Cancelled("worker is shutting down") : link->dead;
  }
  bool copied = it->second.ok();
  link->acks.erase(it);
  if (!copied) link->local_reads = false;  // and never try again
  return copied;
}

Status PeerLinks::Send(int link_id, uint64_t transfer_id, const Status& status,
                       std::string_view data) {
  std::shared_ptr<Channel> channel;
  bool local = false;
  Link* link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    link = Find(link_id);
    if (link == nullptr) return NotFound("no peer link " + std::to_string(link_id));
    if (!link->dead.ok()) return link->dead;
    channel = link->channel;
    local = link->local_reads;
  }
  Status sent;
  if (local && status.ok() && data.size() >= kLocalTransferMin) {
    StatusOr<bool> copied = SendLocal(link, transfer_id, data);
    if (copied.ok() && copied.value()) return Status::Ok();
    sent = copied.status();
  }
  if (sent.ok()) {
    sent = channel->Send(FrameKind::kTransfer,
                         EncodeEventHead(transfer_id, status, data.size()),
                         data);
  }
  if (!sent.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!link->dead.ok()) return link->dead;  // Close() says why
  }
  return sent;
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

void PeerLinks::Close(int link_id, const std::string& why) {
  std::shared_ptr<Channel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Link* link = Find(link_id);
    if (link == nullptr || !link->dead.ok()) return;
    link->dead = Unavailable("link to worker " + link->name + " closed: " +
                             why);
    channel = link->channel;
    cv_.notify_all();
  }
  channel->Shutdown();  // a blocked Send returns; the reader ends
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
