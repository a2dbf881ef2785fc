// Channel over a TCP (or Unix) stream socket.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cerrno>
#include <cstring>
#include <vector>

#include "transport/channel.h"

#include "common/thread_name.h"

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

Status Errno(const char* what, int err) {
  return Unavailable(std::string(what) + ": " + std::strerror(err));
}

// Receive()'s read buffer: a burst of small frames in one recv().
constexpr size_t kReadBufferBytes = 4 << 10;

// recv() that waits for data in poll(), not in recv(): a thread blocked in
// recv() is also woken each time the peer reads what this socket sent (the
// kernel's write-space wake-up shares the socket's wait queue, unfiltered),
// a wake-up for nothing per frame each way; poll() for POLLIN is woken for
// data, the peer's close or an error only.
ssize_t Recv(int fd, char* p, size_t n) {
  while (true) {
    ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return got;
    pollfd readable{fd, POLLIN, 0};
    if (::poll(&readable, 1, -1) < 0 && errno != EINTR) return -1;
  }
}

// Records that bytes arrived now (Channel::LastReceived).
void Arrived(std::atomic<std::chrono::steady_clock::rep>* at) {
  at->store(std::chrono::steady_clock::now().time_since_epoch().count(),
            std::memory_order_relaxed);
}

Status ReadFull(int fd, char* p, size_t n,
                std::atomic<std::chrono::steady_clock::rep>* arrived) {
  while (n > 0) {
    ssize_t got = Recv(fd, p, n);
    if (got == 0) return Unavailable("connection closed by peer");
    if (got < 0) {
      if (errno == EINTR) continue;
      return Errno("recv", errno);
    }
    Arrived(arrived);
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace

// Frames with their iovecs, on the heap from the start: the iovecs point
// into `headers` and into the heads (maybe inline in a std::string), whose
// storage never moves while the batch lives.
struct Channel::Batch {
  std::vector<Frame> frames;
  std::vector<Header> headers;
  std::vector<iovec> iov;
  size_t next = 0;  // first iovec with bytes left
  size_t left = 0;  // bytes left
  std::shared_ptr<const void> owner;

  Batch(std::vector<Frame> f, std::shared_ptr<const void> o)
      : frames(std::move(f)), owner(std::move(o)) {
    headers.reserve(frames.size());
    iov.reserve(frames.size() * 4);
    for (const Frame& frame : frames) {
      size_t size = frame.head.size() + frame.body.size();
      for (std::string_view t : frame.tails) size += t.size();
      headers.push_back(
          Header{kMagic, static_cast<uint32_t>(frame.kind), size});
      left += sizeof(Header) + size;
    }
    auto add = [this](const void* data, size_t size) {
      if (size > 0) iov.push_back({const_cast<void*>(data), size});
    };
    for (size_t i = 0; i < frames.size(); ++i) {
      add(&headers[i], sizeof(Header));
      add(frames[i].head.data(), frames[i].head.size());
      add(frames[i].body.data(), frames[i].body.size());
      for (std::string_view t : frames[i].tails) add(t.data(), t.size());
    }
  }

  // One sendmsg of what is left: the bytes written, or -1 with errno.
  ssize_t WriteSome(int fd, int flags) {
    msghdr msg{};
    msg.msg_iov = iov.data() + next;
    msg.msg_iovlen = std::min<size_t>(IOV_MAX, iov.size() - next);
    ssize_t sent = ::sendmsg(fd, &msg, flags | MSG_NOSIGNAL);
    if (sent <= 0) return sent;
    left -= static_cast<size_t>(sent);
    size_t rest = static_cast<size_t>(sent);
    while (next < iov.size() && rest >= iov[next].iov_len) {
      rest -= iov[next].iov_len;
      ++next;
    }
    if (next < iov.size()) {
      iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + rest;
      iov[next].iov_len -= rest;
    }
    return sent;
  }
};

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
  std::vector<Frame> frames;
  frames.push_back(Frame{kind, std::string(head), body});
  std::unique_lock<std::mutex> lock(mu_);
  StatusOr<uint64_t> ticket =
      WriteOrQueue(std::make_unique<Batch>(std::move(frames), nullptr));
  if (!ticket.ok() || ticket.value() == 0) return ticket.status();
  // `body` is the caller's: wait until it is written or no longer touched.
  uint64_t t = ticket.value();
  cv_.wait(lock, [&] {
    return finished_ >= t || (!closed_.ok() && !writing_);
  });
  return finished_ >= t ? Status::Ok() : closed_;
}

Status Channel::SendMany(std::vector<Frame> frames,
                         std::shared_ptr<const void> owner, bool now) {
  auto batch = std::make_unique<Batch>(std::move(frames), std::move(owner));
  std::lock_guard<std::mutex> lock(mu_);
  return WriteOrQueue(std::move(batch), now).status();
}

StatusOr<uint64_t> Channel::WriteOrQueue(std::unique_ptr<Batch> batch,
                                         bool now) {
  if (!closed_.ok()) return closed_;
  if (now && !writing_ && queue_.empty()) {
    while (batch->left > 0) {
      if (batch->WriteSome(fd_, MSG_DONTWAIT) >= 0) continue;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Status error = Errno("send", errno);
      CloseLocked(error);
      return error;
    }
    if (batch->left == 0) return uint64_t{0};
  }
  backlog_ += batch->left;
  queue_.push_back(std::move(batch));
  // Started on first need: most channels never fill their socket, and one
  // that did (a large upload each step) will again, so it stays.
  if (!writer_.joinable()) {
    writer_ = std::thread([this] {
      NameThisThread("jp-send");
      WriteLoop();
    });
  }
  cv_.notify_all();
  return ++queued_;
}

void Channel::WriteLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return !closed_.ok() || !queue_.empty(); });
    if (!closed_.ok()) return;
    std::unique_ptr<Batch> batch = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    Status error;
    while (batch->left > 0 && error.ok()) {
      lock.unlock();
      ssize_t sent = batch->WriteSome(fd_, 0);  // blocks while the peer waits
      int err = errno;
      lock.lock();
      if (sent >= 0) {
        backlog_ -= static_cast<size_t>(sent);
      } else if (err != EINTR) {
        error = Errno("send", err);
      }
    }
    writing_ = false;
    std::deque<std::unique_ptr<Batch>> dropped;
    if (error.ok()) {
      ++finished_;
    } else {
      // The peer is gone or we were shut down: the reader sees it too.
      CloseLocked(error);
      backlog_ -= batch->left;
      dropped = DropQueueLocked();
    }
    cv_.notify_all();
    lock.unlock();
    batch.reset();  // owners may free large buffers: not under mu_
    dropped.clear();
    lock.lock();
  }
}

void Channel::CloseLocked(const Status& why) {
  if (closed_.ok()) closed_ = why;
  ::shutdown(fd_, SHUT_RDWR);
  cv_.notify_all();
}

std::deque<std::unique_ptr<Channel::Batch>> Channel::DropQueueLocked() {
  std::deque<std::unique_ptr<Batch>> dropped;
  dropped.swap(queue_);
  for (const auto& b : dropped) backlog_ -= b->left;
  return dropped;
}

size_t Channel::backlog_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return backlog_;
}

Status Channel::Receive(FrameKind* kind, Bytes* body,
                        const Placement* placement) {
  if (read_buffer_ == nullptr) {
    // Not zeroed: pages are touched only as far as frames fill them (a
    // controller of 1,000 islands has 1,000 of these).
    read_buffer_.reset(new char[kReadBufferBytes]);
  }
  if (read_start_ == read_end_) read_start_ = read_end_ = 0;
  // The header whole in the buffer (kReadBufferBytes holds many), with
  // whatever else the socket has.
  if (read_end_ - read_start_ < sizeof(Header) &&
      read_start_ + sizeof(Header) > kReadBufferBytes) {
    std::memmove(read_buffer_.get(), read_buffer_.get() + read_start_,
                 read_end_ - read_start_);
    read_end_ -= read_start_;
    read_start_ = 0;
  }
  while (read_end_ - read_start_ < sizeof(Header)) {
    ssize_t got = Recv(fd_, read_buffer_.get() + read_end_,
                       kReadBufferBytes - read_end_);
    if (got == 0) return Unavailable("connection closed by peer");
    if (got < 0) {
      if (errno == EINTR) continue;
      return Errno("recv", errno);
    }
    Arrived(&last_received_);
    read_end_ += static_cast<size_t>(got);
  }
  Header h;
  std::memcpy(&h, read_buffer_.get() + read_start_, sizeof(h));
  read_start_ += sizeof(h);
  if (h.magic != kMagic || h.length > kMaxFrameBytes) {
    return DataLoss("bad frame header (wrong peer or version?)");
  }
  const bool placed = placement != nullptr &&
                      h.kind == static_cast<uint32_t>(placement->kind);
  size_t length = placed ? std::min<size_t>(h.length, placement->head)
                         : h.length;
  char* w;
  StatusOr<Bytes> buffer = Bytes::Allocate(length, &w);
  if (!buffer.ok()) {
    return Status(buffer.status().code(),
                  "peer sent a frame of " + std::to_string(h.length) +
                      " bytes: " + buffer.status().message());
  }
  *body = std::move(buffer.value());
  Status s = ReadInto(w, length);
  if (!s.ok()) return s;
  if (placed) {
    StatusOr<char*> rest = placement->place(body->view(), h.length - length);
    if (!rest.ok()) return rest.status();
    s = ReadInto(rest.value(), h.length - length);
    if (!s.ok()) return s;
  }
  *kind = static_cast<FrameKind>(h.kind);
  return Status::Ok();
}

Status Channel::ReadInto(char* w, size_t n) {
  // What was read already, then the rest straight from the socket.
  size_t have = std::min<size_t>(read_end_ - read_start_, n);
  std::memcpy(w, read_buffer_.get() + read_start_, have);
  read_start_ += have;
  return ReadFull(fd_, w + have, n - have, &last_received_);
}

void Channel::Shutdown() {
  std::thread writer;
  std::deque<std::unique_ptr<Batch>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CloseLocked(Unavailable("channel shut down"));
    dropped = DropQueueLocked();
    writer.swap(writer_);
  }
  // The shut-down socket fails the writer's blocked sendmsg at once.
  if (writer.joinable()) writer.join();
}

std::chrono::steady_clock::time_point Channel::LastReceived() const {
  return std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(
          last_received_.load(std::memory_order_relaxed)));
}

bool Channel::IsLocal() const {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  return ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
         addr.ss_family == AF_UNIX;
}

}  // namespace jax_pathways
