#include "transport/local_reads.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transport/wire.h"

namespace jax_pathways {

std::string EncodeLocation(std::string_view data) {
  WireWriter w;
  w.U64(static_cast<uint64_t>(::getpid()));
  w.U64(reinterpret_cast<uint64_t>(data.data()));
  w.U64(data.size());
  return w.Take();
}

bool DecodeLocation(std::string_view* in, Location* where) {
  WireReader r(*in);
  if (!r.U64(&where->pid) || !r.U64(&where->address) ||
      !r.U64(&where->size)) {
    return false;
  }
  in->remove_prefix(kLocationBytes);
  return true;
}

std::string EncodeLocations(const std::vector<std::string_view>& data) {
  WireWriter w;
  w.U32(static_cast<uint32_t>(data.size()));
  std::string out = w.Take();
  for (std::string_view d : data) out += EncodeLocation(d);
  return out;
}

bool DecodeLocations(std::string_view* in, std::vector<Location>* where) {
  WireReader r(*in);
  uint32_t n;
  if (!r.U32(&n) || n > (in->size() - sizeof(n)) / kLocationBytes) {
    return false;
  }
  in->remove_prefix(sizeof(n));
  where->resize(n);
  for (Location& l : *where) {
    if (!DecodeLocation(in, &l)) return false;
  }
  return true;
}

Status ReadLocation(const Location& where, char* out) {
  size_t done = 0;
  while (done < where.size) {
    iovec local{out + done, where.size - done};
    iovec remote{reinterpret_cast<void*>(where.address + done),
                 where.size - done};
    ssize_t n = ::process_vm_readv(static_cast<pid_t>(where.pid), &local, 1,
                                   &remote, 1, 0);
    if (n <= 0) {
      return Unavailable(std::string("process_vm_readv: ") +
                         (n < 0 ? std::strerror(errno) : "no progress"));
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace jax_pathways
