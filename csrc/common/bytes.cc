#include "common/bytes.h"

#include <sys/mman.h>

#include <cstring>
#include <new>

namespace jax_pathways {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

Bytes Bytes::Allocate(size_t n, char** writable) {
  Bytes out;
  out.size_ = n;
  if (n == 0) {
    *writable = nullptr;
    return out;
  }
  char* p = nullptr;
  if (n >= kHugePage / 2) {
    size_t mapped = (n + kHugePage - 1) / kHugePage * kHugePage;
    void* m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      ::madvise(m, mapped, MADV_HUGEPAGE);  // a hint; fine if refused
      p = static_cast<char*>(m);
      out.storage_ = std::shared_ptr<const char>(
          p, [mapped](const char* q) { ::munmap(const_cast<char*>(q), mapped); });
    }
  }
  if (p == nullptr) {
    p = new char[n];
    out.storage_ = std::shared_ptr<const char>(p, std::default_delete<char[]>());
  }
  out.data_ = p;
  *writable = p;
  return out;
}

Bytes Bytes::Copy(std::string_view s) {
  char* w;
  Bytes out = Allocate(s.size(), &w);
  if (!s.empty()) std::memcpy(w, s.data(), s.size());
  return out;
}

}  // namespace jax_pathways
