#include "controller/dispatcher/buffer_futures.h"

#include <string>

namespace jax_pathways {

void BufferFutures::AddPending(const std::vector<BufferId>& ids) {
  for (BufferId id : ids) entries_[id] = Entry{};
}

void BufferFutures::Resolve(const std::vector<BufferId>& ids,
                            const Status& status,
                            std::vector<Completion>* out) {
  for (BufferId id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;  // forgotten while in flight
    Entry& e = it->second;
    // A failure sticks: a buffer whose island was lost stays lost even if
    // another island's part of its program reports later.
    if (e.state == BufferState::kFailed) continue;
    e.state = status.ok() ? BufferState::kReady : BufferState::kFailed;
    e.failure = status;
    for (auto& w : e.waiters) {
      if (w->done) continue;
      if (!status.ok()) {
        w->done = true;
        out->push_back(Completion{w->tag, status, {}});
      } else if (--w->remaining == 0) {
        w->done = true;
        out->push_back(Completion{w->tag, Status::Ok(), {}});
      }
    }
    e.waiters.clear();
  }
}

void BufferFutures::WhenReady(const std::vector<BufferId>& ids, uint64_t tag,
                              std::vector<Completion>* out) {
  auto waiter = std::make_shared<Waiter>(Waiter{tag, 0});
  std::vector<Entry*> pending;
  for (BufferId id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      out->push_back(Completion{
          tag, NotFound("buffer " + std::to_string(id) + " is unknown"), {}});
      return;
    }
    if (it->second.state == BufferState::kFailed) {
      out->push_back(Completion{tag, it->second.failure, {}});
      return;
    }
    if (it->second.state == BufferState::kPending) {
      pending.push_back(&it->second);
    }
  }
  if (pending.empty()) {
    out->push_back(Completion{tag, Status::Ok(), {}});
    return;
  }
  waiter->remaining = pending.size();
  for (Entry* e : pending) e->waiters.push_back(waiter);
}

Status BufferFutures::FirstFailure(const std::vector<BufferId>& ids) const {
  for (BufferId id : ids) {
    auto it = entries_.find(id);
    if (it != entries_.end() && it->second.state == BufferState::kFailed) {
      return it->second.failure;
    }
  }
  return Status::Ok();
}

void BufferFutures::Forget(const std::vector<BufferId>& ids,
                           std::vector<Completion>* out) {
  for (BufferId id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;
    for (auto& w : it->second.waiters) {
      if (w->done) continue;
      w->done = true;
      out->push_back(Completion{
          w->tag,
          Status(Code::kFailedPrecondition,
                 "the array was deleted while a request waited for it"),
          {}});
    }
    if (it->second.holds > 0) {
      it->second.waiters.clear();
      it->second.forgotten = true;
    } else {
      entries_.erase(it);
    }
  }
}

void BufferFutures::Hold(const std::vector<BufferId>& ids) {
  for (BufferId id : ids) {
    auto it = entries_.find(id);
    if (it != entries_.end()) ++it->second.holds;
  }
}

void BufferFutures::Release(const std::vector<BufferId>& ids) {
  for (BufferId id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.holds == 0) continue;
    if (--it->second.holds == 0 && it->second.forgotten) entries_.erase(it);
  }
}

BufferState BufferFutures::State(BufferId id, Status* failure) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    *failure = NotFound("buffer " + std::to_string(id) + " is unknown");
    return BufferState::kFailed;
  }
  *failure = it->second.failure;
  return it->second.state;
}

}  // namespace jax_pathways
