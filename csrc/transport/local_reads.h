// Local reads: a process copies bytes straight out of another process on
// the same host (process_vm_readv): one copy, where a socket takes two
// (into the kernel's buffers and out again).
//
// The owner of the bytes sends their Location and keeps them alive until
// the reader is done; the reader copies them itself. Whether a reader may
// read another process's memory is the kernel's call (same user, ptrace
// policy): senders ask once, with a probe, or fall back to sending bytes.
#ifndef JAX_PATHWAYS_CSRC_TRANSPORT_LOCAL_READS_H_
#define JAX_PATHWAYS_CSRC_TRANSPORT_LOCAL_READS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace jax_pathways {

// Where `size` bytes are: in process `pid` at `address`.
struct Location {
  uint64_t pid = 0;
  uint64_t address = 0;
  uint64_t size = 0;
};
inline constexpr size_t kLocationBytes = 3 * sizeof(uint64_t);

// The Location of `data` in this process, encoded (kLocationBytes long).
std::string EncodeLocation(std::string_view data);
// Reads an encoded Location from the front of `in` and drops it from `in`.
bool DecodeLocation(std::string_view* in, Location* where);
// Copies the bytes at `where` into `out` (where.size bytes).
Status ReadLocation(const Location& where, char* out);
// Copies the bytes at each of `where`, in order and back to back, into
// `out`: one syscall for up to IOV_MAX (1024) Locations in one process.
Status ReadLocations(const std::vector<Location>& where, char* out);

// Several Locations, encoded as a u32 count and then each, in order.
std::string EncodeLocations(const std::vector<std::string_view>& data);
bool DecodeLocations(std::string_view* in, std::vector<Location>* where);

// Bytes every build knows: a reader that gets them from the prober's
// Location may read its memory.
inline constexpr std::string_view kReadProbePattern =
    "jax_pathways: may this process read the sender's memory?";

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_TRANSPORT_LOCAL_READS_H_
