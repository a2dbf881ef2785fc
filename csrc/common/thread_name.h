// Names the calling thread (up to 15 characters), so top -H, perf and gdb
// show which of the core's threads is busy.
#ifndef JAX_PATHWAYS_CSRC_COMMON_THREAD_NAME_H_
#define JAX_PATHWAYS_CSRC_COMMON_THREAD_NAME_H_

#include <pthread.h>

#include <string>

namespace jax_pathways {

inline void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_COMMON_THREAD_NAME_H_
