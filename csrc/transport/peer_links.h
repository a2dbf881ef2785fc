// PeerLinks: a worker's data plane to the other workers.
//
// Array bytes move worker to worker, never through the controller. A link is
// one authenticated socket to one peer (connected and authenticated by
// Python) and carries transfers both ways. A transfer is a Transfer frame laid
// out like an Event (id, status, bytes): a sender whose source array failed
// pushes the error instead of bytes, so the receiving op fails with the real
// cause instead of timing out.
//
// Thread safety: all methods may be called from any thread; Send(),
// Receive() and Shutdown() block and must be called without the GIL.
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
  void Shutdown();

 private:
  struct Link {
    std::string name;
    std::shared_ptr<Channel> channel;
    Status dead;  // OK while connected
    std::map<uint64_t, StatusOr<Bytes>> arrived;
    std::thread reader;
  };
  void ReadLoop(Link* link);
  Link* Find(int link);

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Link>> links_;
  bool shut_down_ = false;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_TRANSPORT_PEER_LINKS_H_
