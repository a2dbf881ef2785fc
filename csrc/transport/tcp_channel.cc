// Channel over a TCP (or Unix) stream socket.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "transport/channel.h"

namespace jax_pathways {
namespace {

constexpr uint32_t kMagic = 0x4a505746;  // "JPWF"
// Refuse absurd lengths from a corrupt header before allocating.
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 40;

struct Header {
  uint32_t magic;
  uint32_t kind;
  uint64_t length;
};

Status Errno(const char* what) {
  return Unavailable(std::string(what) + ": " + std::strerror(errno));
}

Status ReadFull(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) return Unavailable("connection closed by peer");
    if (got < 0) {
      if (errno == EINTR) continue;
      return Errno("recv");
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace

Channel::Channel(int fd) : fd_(fd) {
  int one = 1;
  // Latency matters more than packet count for small launches.
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Channel::~Channel() {
  Shutdown();
  ::close(fd_);
}

Status Channel::Send(FrameKind kind, std::string_view head,
                     std::string_view body) {
  return SendMany({Frame{kind, std::string(head), body}});
}

Status Channel::SendMany(const std::vector<Frame>& frames) {
  std::vector<Header> headers;
  headers.reserve(frames.size());
  std::vector<iovec> iov;
  iov.reserve(frames.size() * 4);
  for (const Frame& f : frames) {
    size_t size = f.head.size() + f.body.size();
    for (std::string_view t : f.tails) size += t.size();
    headers.push_back(Header{kMagic, static_cast<uint32_t>(f.kind), size});
  }
  auto add = [&iov](std::string_view part) {
    if (!part.empty()) {
      iov.push_back({const_cast<char*>(part.data()), part.size()});
    }
  };
  for (size_t i = 0; i < frames.size(); ++i) {
    iov.push_back({&headers[i], sizeof(Header)});
    add(frames[i].head);
    add(frames[i].body);
    for (std::string_view part : frames[i].tails) add(part);
  }
  constexpr size_t kMaxIov = 512;  // below IOV_MAX
  size_t idx = 0;
  std::lock_guard<std::mutex> lock(send_mu_);
  while (idx < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + idx;
    msg.msg_iovlen = std::min(kMaxIov, iov.size() - idx);
    ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return Errno("send");
    }
    size_t left = static_cast<size_t>(sent);
    while (idx < iov.size() && left >= iov[idx].iov_len) {
      left -= iov[idx].iov_len;
      ++idx;
    }
    if (idx < iov.size()) {
      iov[idx].iov_base = static_cast<char*>(iov[idx].iov_base) + left;
      iov[idx].iov_len -= left;
    }
  }
  return Status::Ok();
}

Status Channel::Receive(FrameKind* kind, Bytes* body) {
  Header h;
  Status s = ReadFull(fd_, reinterpret_cast<char*>(&h), sizeof(h));
  if (!s.ok()) return s;
  if (h.magic != kMagic || h.length > kMaxFrameBytes) {
    return DataLoss("bad frame header (wrong peer or version?)");
  }
  char* w;
  StatusOr<Bytes> allocated = Bytes::Allocate(h.length, &w);
  if (!allocated.ok()) return allocated.status();
  *body = std::move(allocated.value());
  s = ReadFull(fd_, w, h.length);
  if (!s.ok()) return s;
  *kind = static_cast<FrameKind>(h.kind);
  return Status::Ok();
}

void Channel::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

bool Channel::IsLocal() const {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  return ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
         addr.ss_family == AF_UNIX;
}

}  // namespace jax_pathways
