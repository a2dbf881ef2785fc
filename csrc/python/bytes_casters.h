// Moving payload bytes across the boundary with as few copies as possible.
#ifndef JAX_PATHWAYS_CSRC_PYTHON_BYTES_CASTERS_H_
#define JAX_PATHWAYS_CSRC_PYTHON_BYTES_CASTERS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <string_view>

#include "common/bytes.h"

namespace jax_pathways {

// Views any bytes-like object (bytes, bytearray, memoryview, numpy array)
// for as long as this object lives; it holds the buffer export, so the view
// stays valid with the GIL released.
class BytesView {
 public:
  explicit BytesView(const pybind11::buffer& b) : info_(b.request()) {}
  std::string_view view() const {
    return std::string_view(static_cast<const char*>(info_.ptr),
                            static_cast<size_t>(info_.size * info_.itemsize));
  }

 private:
  pybind11::buffer_info info_;
};

// Hands `b` to Python as a read-only uint8 numpy array that keeps its
// buffer alive (no copy).
inline pybind11::array_t<uint8_t> ToNumpy(Bytes b) {
  auto* owned = new Bytes(std::move(b));
  pybind11::capsule free_when_done(
      owned, [](void* p) { delete static_cast<Bytes*>(p); });
  pybind11::array_t<uint8_t> out(
      {static_cast<pybind11::ssize_t>(owned->size())}, {1},
      reinterpret_cast<const uint8_t*>(owned->data()), free_when_done);
  pybind11::detail::array_proxy(out.ptr())->flags &=
      ~pybind11::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return out;
}

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_PYTHON_BYTES_CASTERS_H_
