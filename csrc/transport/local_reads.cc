#include "transport/local_reads.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
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
  return ReadLocations({where}, out);
}

Status ReadLocations(const std::vector<Location>& where, char* out) {
  std::vector<iovec> remote;
  size_t i = 0, done = 0;  // where[i]'s first `done` bytes are read
  while (i < where.size()) {
    // One call for the next run of Locations in one process.
    remote.clear();
    size_t total = 0;
    for (size_t j = i; j < where.size() &&
                       remote.size() < static_cast<size_t>(IOV_MAX) &&
                       where[j].pid == where[i].pid;
         ++j) {
      size_t skip = j == i ? done : 0;
      if (where[j].size == skip) continue;
      remote.push_back({reinterpret_cast<void*>(where[j].address + skip),
                        where[j].size - skip});
      total += where[j].size - skip;
    }
    if (total == 0) break;  // only empty Locations left
    iovec local{out, total};
    ssize_t n = ::process_vm_readv(static_cast<pid_t>(where[i].pid), &local,
                                   1, remote.data(), remote.size(), 0);
    if (n <= 0) {
      return Unavailable(std::string("process_vm_readv: ") +
                         (n < 0 ? std::strerror(errno) : "no progress"));
    }
    out += n;
    for (size_t left = static_cast<size_t>(n); left > 0;) {
      size_t rest = where[i].size - done;
      if (left < rest) {
        done += left;
        break;
      }
      left -= rest;
      ++i;
      done = 0;
    }
  }
  return Status::Ok();
}

}  // namespace jax_pathways
