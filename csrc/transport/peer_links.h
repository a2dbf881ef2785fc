// PeerLinks: a worker's data plane to the other workers.
//
// Array bytes move worker to worker, never through the controller. A link is
// one authenticated socket to one peer (connected and authenticated by
// Python) and carries transfers both ways. A transfer is a Transfer frame laid
// out like an Event (id, status, bytes): a sender whose source array failed
// pushes the error instead of bytes, so the receiving op fails with the real
// cause instead of timing out.
//
// Between workers of one host (a Unix socket) a large transfer is a
// TransferLocal frame instead: where the sender holds the bytes. The
// receiver's reader copies them straight out of the sender's memory
// (local_reads.h) and acknowledges; the sender waits for that, and falls back to
// sending the bytes if the copy is refused (e.g. ptrace restrictions).
//
// Thread safety: all methods may be called from any thread; Send(),
// Receive(), Close() and Shutdown() block and must be called without the
// GIL.
#ifndef JAX_PATHWAYS_CSRC_TRANSPORT_PEER_LINKS_H_
#define JAX_PATHWAYS_CSRC_TRANSPORT_PEER_LINKS_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "transport/channel.h"
#include "transport/messages.h"

namespace jax_pathways {

class PeerLinks {
 public:
  PeerLinks() = default;
  ~PeerLinks();
  PeerLinks(const PeerLinks&) = delete;
  PeerLinks& operator=(const PeerLinks&) = delete;

  // Takes ownership of `fd`; returns the link's id (-1 after Shutdown()).
  int Add(int fd, std::string peer_name);
  Status Send(int link, uint64_t transfer_id, const Status& status,
              std::string_view data);
  // Waits up to `timeout_s` for transfer `transfer_id` to arrive on `link`.
  StatusOr<Bytes> Receive(int link, uint64_t transfer_id, double timeout_s);
  // The peer is lost (the controller says so): sends and receives on the
  // link, waiting or later, fail with `why` now, not when (if ever) its
  // socket ends: a stopped peer keeps it open and reads nothing.
  void Close(int link, const std::string& why);
  void Shutdown();

 private:
  struct Link {
    std::string name;
    std::shared_ptr<Channel> channel;
    bool local_reads = false;  // the peer may copy from our memory
    Status dead;  // OK while connected
    std::map<uint64_t, StatusOr<Bytes>> arrived;
    std::map<uint64_t, Status> acks;  // local transfers the peer copied
    std::thread reader;
  };
  void ReadLoop(Link* link);
  // Copies a TransferLocal's bytes out of the sender; the status goes back.
  Status CopyLocal(const Event& event, Bytes* out);
  // Sends a TransferLocal and waits for its ack; false: send the bytes.
  StatusOr<bool> SendLocal(Link* link, uint64_t transfer_id,
                           std::string_view data);
  Link* Find(int link);

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Link>> links_;
  bool shut_down_ = false;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_TRANSPORT_PEER_LINKS_H_
