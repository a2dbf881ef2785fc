// Channel over a TCP (or Unix) stream socket.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
  Header h{kMagic, static_cast<uint32_t>(kind), head.size() + body.size()};
  iovec iov[3] = {{&h, sizeof(h)},
                  {const_cast<char*>(head.data()), head.size()},
                  {const_cast<char*>(body.data()), body.size()}};
  int idx = 0;
  std::lock_guard<std::mutex> lock(send_mu_);
  while (idx < 3) {
    msghdr msg{};
    msg.msg_iov = iov + idx;
    msg.msg_iovlen = 3 - idx;
    ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return Errno("send");
    }
    size_t left = static_cast<size_t>(sent);
    while (idx < 3 && left >= iov[idx].iov_len) {
      left -= iov[idx].iov_len;
      ++idx;
    }
    if (idx < 3) {
      iov[idx].iov_base = static_cast<char*>(iov[idx].iov_base) + left;
      iov[idx].iov_len -= left;
    }
  }
  return Status::Ok();
}

Status Channel::Receive(FrameKind* kind, std::string* body) {
  Header h;
  Status s = ReadFull(fd_, reinterpret_cast<char*>(&h), sizeof(h));
  if (!s.ok()) return s;
  if (h.magic != kMagic || h.length > kMaxFrameBytes) {
    return DataLoss("bad frame header (wrong peer or version?)");
  }
  body->resize(h.length);
  s = ReadFull(fd_, body->data(), h.length);
  if (!s.ok()) return s;
  *kind = static_cast<FrameKind>(h.kind);
  return Status::Ok();
}

void Channel::Shutdown() { ::shutdown(fd_, SHUT_RDWR); }

}  // namespace jax_pathways
