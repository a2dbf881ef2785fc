#include "controller/server/host_buffers.h"

namespace jax_pathways {
namespace {

Status UnknownSession(uint64_t session) {
  return NotFound("unknown session " + std::to_string(session));
}

Status UnknownHandle(uint64_t handle) {
  return NotFound("host buffer handle " + std::to_string(handle) +
                  " not found");
}

}  // namespace

size_t SizeOf(const HostBuffer& buffer) {
  size_t n = 0;
  for (const Bytes& piece : buffer) n += piece.size();
  return n;
}

void HostBuffers::OpenSession(uint64_t session) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_[session];
}

void HostBuffers::CloseSession(uint64_t session) {
  std::vector<std::function<void()>> wakes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    for (auto& [handle, buffer] : it->second) bytes_ -= SizeOf(buffer);
    sessions_.erase(it);
    watched_.erase(watched_.lower_bound({session, 0}),
                   watched_.upper_bound({session, UINT64_MAX}));
    EraseStreams(session, 0, UINT64_MAX);
    wakes = TakeWakes(session, 0, UINT64_MAX);
  }
  for (auto& wake : wakes) wake();
}

std::vector<std::function<void()>> HostBuffers::TakeWakes(uint64_t session,
                                                          uint64_t first,
                                                          uint64_t last) {
  auto begin = store_watches_.lower_bound({session, first});
  auto end = store_watches_.upper_bound({session, last});
  std::vector<std::function<void()>> wakes;
  for (auto it = begin; it != end; ++it) wakes.push_back(std::move(it->second));
  store_watches_.erase(begin, end);
  return wakes;
}

bool HostBuffers::WatchStore(uint64_t session, uint64_t handle,
                             std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end() || it->second.count(handle)) return false;
  store_watches_.emplace(std::pair(session, handle), std::move(wake));
  return true;
}

void HostBuffers::EraseStreams(uint64_t session, uint64_t first,
                               uint64_t last) {
  auto begin = streams_.lower_bound({session, first});
  auto end = streams_.upper_bound({session, last});
  for (auto it = begin; it != end; ++it) it->second.release(it->second.target);
  streams_.erase(begin, end);
}

void HostBuffers::set_waker(std::function<void()> waker) {
  std::lock_guard<std::mutex> lock(mu_);
  waker_ = std::move(waker);
}

bool HostBuffers::HasSession(uint64_t session) {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.count(session) > 0;
}

Status HostBuffers::Store(uint64_t session, uint64_t handle, HostBuffer data) {
  std::function<void()> wake;
  std::vector<std::function<void()>> wakes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return UnknownSession(session);
    size_t size = SizeOf(data);
    if (!it->second.emplace(handle, std::move(data)).second) {
      return Status(Code::kAlreadyExists, "host buffer " +
                                              std::to_string(handle) +
                                              " already exists");
    }
    bytes_ += size;
    EraseStreams(session, handle, handle);  // it has had every piece
    if (watched_.erase({session, handle})) wake = waker_;
    wakes = TakeWakes(session, handle, handle);
  }
  if (wake) wake();
  for (auto& w : wakes) w();
  return Status::Ok();
}

StatusOr<HostBuffer> HostBuffers::Lookup(uint64_t session, uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return UnknownSession(session);
  auto b = it->second.find(handle);
  if (b == it->second.end()) return UnknownHandle(handle);
  return b->second;
}

StatusOr<std::optional<HostBuffer>> HostBuffers::TakeOrWatch(
    uint64_t session, uint64_t handle, const JpUploadStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return UnknownSession(session);
  auto b = it->second.find(handle);
  if (b == it->second.end()) {
    watched_.insert({session, handle});
    if (stream != nullptr && streams_.emplace(std::pair(session, handle),
                                              *stream).second) {
      stream->retain(stream->target);
    }
    return std::optional<HostBuffer>();
  }
  HostBuffer out = std::move(b->second);
  it->second.erase(b);
  bytes_ -= SizeOf(out);
  return std::optional<HostBuffer>(std::move(out));
}

std::optional<std::vector<HostBuffer>> HostBuffers::TakeAllIfSizes(
    uint64_t session, const std::vector<uint64_t>& handles,
    const std::vector<size_t>& sizes, size_t* missing) {
  *missing = handles.size();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end() || sizes.size() != handles.size()) {
    return std::nullopt;
  }
  std::map<uint64_t, HostBuffer>& buffers = it->second;
  std::vector<std::map<uint64_t, HostBuffer>::iterator> found;
  found.reserve(handles.size());
  bool whole = true;
  for (size_t i = 0; i < handles.size(); ++i) {
    auto b = buffers.find(handles[i]);
    if (b == buffers.end()) {
      *missing = i;
    } else {
      whole = whole && SizeOf(b->second) == sizes[i];
      found.push_back(b);
    }
  }
  if (*missing != handles.size() || !whole) return std::nullopt;
  std::set<uint64_t> distinct(handles.begin(), handles.end());
  if (distinct.size() != handles.size()) return std::nullopt;
  std::vector<HostBuffer> out;
  out.reserve(found.size());
  for (size_t i = 0; i < found.size(); ++i) {
    out.push_back(std::move(found[i]->second));
    buffers.erase(found[i]);
    bytes_ -= sizes[i];
  }
  return out;
}

void HostBuffers::Arrived(uint64_t session, uint64_t handle,
                          const HostBuffer& upload, size_t* pieces_sent,
                          uint64_t* bytes_sent) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find({session, handle});
  if (it == streams_.end() || *pieces_sent >= upload.size()) return;
  // The pieces' references, kept until the stream is done with them.
  auto* kept = new HostBuffer(upload.begin() + *pieces_sent, upload.end());
  std::vector<const char*> data;
  std::vector<size_t> sizes;
  uint64_t offset = *bytes_sent;
  for (const Bytes& piece : *kept) {
    data.push_back(piece.data());
    sizes.push_back(piece.size());
    *bytes_sent += piece.size();
  }
  *pieces_sent = upload.size();
  // Under mu_: once Unstream() returns, nothing more goes out (the stage's
  // end must follow every part of it to the worker).
  it->second.forward(
      it->second.target, offset, data.data(), sizes.data(), data.size(),
      [](void* owner) { delete static_cast<HostBuffer*>(owner); }, kept);
}

void HostBuffers::Unstream(uint64_t session, uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseStreams(session, handle, handle);
}

Status HostBuffers::Delete(uint64_t session, uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return UnknownSession(session);
  auto b = it->second.find(handle);
  if (b == it->second.end()) return UnknownHandle(handle);
  bytes_ -= SizeOf(b->second);
  it->second.erase(b);
  return Status::Ok();
}

size_t HostBuffers::total_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace jax_pathways
