#include "controller/dispatcher/launch_queue.h"

namespace jax_pathways {

void LaunchQueue::Push(Op op, GangSlot slot, std::vector<Op>* to_send) {
  waiting_.emplace_back(std::move(op), std::move(slot));
  Admit(to_send);
}

std::optional<GangSlot> LaunchQueue::Finish(uint64_t seq,
                                            std::vector<Op>* to_send) {
  auto it = sent_.find(seq);
  if (it == sent_.end()) return std::nullopt;
  GangSlot slot = std::move(it->second);
  sent_.erase(it);
  if (slot.is_launch) window_.Release();
  Admit(to_send);
  return slot;
}

std::vector<GangSlot> LaunchQueue::DrainAll() {
  std::vector<GangSlot> out;
  for (auto& [seq, slot] : sent_) out.push_back(std::move(slot));
  sent_.clear();
  for (auto& [op, slot] : waiting_) out.push_back(std::move(slot));
  waiting_.clear();
  while (window_.in_flight() > 0) window_.Release();
  return out;
}

const GangSlot* LaunchQueue::OldestLaunch() const {
  const GangSlot* oldest = nullptr;
  uint64_t first = 0;
  for (const auto& [seq, slot] : sent_) {
    if (slot.is_launch && (oldest == nullptr || seq < first)) {
      oldest = &slot;
      first = seq;
    }
  }
  return oldest;
}

size_t LaunchQueue::OpsOfOthers(ClientId client) const {
  size_t n = 0;
  for (const auto& [seq, slot] : sent_) n += slot.client != client;
  for (const auto& [op, slot] : waiting_) n += slot.client != client;
  return n;
}

void LaunchQueue::Admit(std::vector<Op>* to_send) {
  while (!waiting_.empty()) {
    auto& [op, slot] = waiting_.front();
    if (slot.is_launch) {
      if (!window_.HasRoom()) return;
      window_.Acquire();
    }
    sent_.emplace(op.seq, std::move(slot));
    to_send->push_back(std::move(op));
    waiting_.pop_front();
  }
}

}  // namespace jax_pathways
