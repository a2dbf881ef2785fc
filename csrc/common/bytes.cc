#include "common/bytes.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace jax_pathways {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Freed mappings are kept for reuse, up to a cap: a transfer into a mapping
// whose pages are already faulted in runs at copy speed instead of at the
// page-fault rate (the same 64 MiB transfer repeats every training step).
class MappingPool {
 public:
  static MappingPool& Get() {
    static MappingPool* pool = new MappingPool();  // never destroyed
    return *pool;
  }

  void* Take(size_t mapped) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(mapped);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    pooled_ -= mapped;
    return p;
  }

  void Give(void* p, size_t mapped) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pooled_ + mapped <= cap_) {
        free_[mapped].push_back(p);
        pooled_ += mapped;
        return;
      }
    }
    ::munmap(p, mapped);
  }

  // Whether a freed mapping of this size may come back for reuse.
  bool Keeps(size_t mapped) const { return mapped <= cap_; }

 private:
  MappingPool() {
    const char* mb = std::getenv("JAX_PATHWAYS_BUFFER_POOL_MB");
    cap_ = (mb != nullptr ? std::strtoull(mb, nullptr, 10) : 512) << 20;
  }

  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  size_t pooled_ = 0;
  size_t cap_ = 0;
};

Status CannotAllocate(size_t n) {
  return Status(Code::kResourceExhausted,
                "cannot allocate " + std::to_string(n) + " bytes");
}

}  // namespace

StatusOr<Bytes> Bytes::Allocate(size_t n, char** writable) {
  Bytes out;
  out.size_ = n;
  if (n == 0) {
    *writable = nullptr;
    return out;
  }
  if (n > SIZE_MAX - kHugePage) {  // rounding up to pages would wrap
    return CannotAllocate(n);
  }
  char* p = nullptr;
  if (n >= kHugePage / 2) {
    size_t mapped = (n + kHugePage - 1) / kHugePage * kHugePage;
    void* m = MappingPool::Get().Take(mapped);
    if (m == nullptr) {
      m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m != MAP_FAILED) {
        // Huge pages only for mappings the pool can keep, whose first touch
        // is paid once. One past the pool is faulted in anew every time,
        // and a huge page's first touch needs a whole free 2 MiB block,
        // which the kernel may compact memory to find and a VM's balloon
        // has likely handed back to its host: on the test VM the receive
        // buffer of a 512 MiB fetch cost the controller 3-4 s of kernel
        // time (clear_page under huge page faults), and the get took
        // 4.8-6.7 s against 1.2-1.8 s on small pages.
        if (MappingPool::Get().Keeps(mapped)) {
          ::madvise(m, mapped, MADV_HUGEPAGE);  // a hint; fine if refused
        }
      } else {
        m = nullptr;
      }
    }
    if (m != nullptr) {
      p = static_cast<char*>(m);
      out.storage_ = std::shared_ptr<const char>(p, [mapped](const char* q) {
        MappingPool::Get().Give(const_cast<char*>(q), mapped);
      });
    }
  }
  if (p == nullptr) {
    // 64-byte aligned like the mappings, so aligned payload offsets are
    // aligned addresses too.
    p = static_cast<char*>(
        ::operator new(n, std::align_val_t{64}, std::nothrow));
    if (p == nullptr) {
      return CannotAllocate(n);
    }
    out.storage_ = std::shared_ptr<const char>(p, [](const char* q) {
      ::operator delete(const_cast<char*>(q), std::align_val_t{64});
    });
  }
  out.data_ = p;
  *writable = p;
  return out;
}

Bytes Bytes::Copy(std::string_view s) {
  char* w;
  StatusOr<Bytes> out = Allocate(s.size(), &w);
  if (!out.ok()) throw std::bad_alloc();
  if (!s.empty()) std::memcpy(w, s.data(), s.size());
  return std::move(out.value());
}

}  // namespace jax_pathways
