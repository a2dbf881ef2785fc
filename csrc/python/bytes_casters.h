// Moving payload bytes across the boundary with as few copies as possible.
#ifndef JAX_PATHWAYS_CSRC_PYTHON_BYTES_CASTERS_H_
#define JAX_PATHWAYS_CSRC_PYTHON_BYTES_CASTERS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// Names the capsule that owns the Bytes behind an array from ToNumpy, so
// SharedOrCopy can find them again (in either extension module).
inline constexpr char kBytesCapsule[] = "jax_pathways.Bytes";

// Hands `b` to Python as a read-only uint8 numpy array that keeps its
// buffer alive (no copy).
inline pybind11::array_t<uint8_t> ToNumpy(Bytes b) {
  auto* owned = new Bytes(std::move(b));
  pybind11::capsule free_when_done(
      owned, kBytesCapsule, [](PyObject* c) {
        delete static_cast<Bytes*>(PyCapsule_GetPointer(c, kBytesCapsule));
      });
  pybind11::array_t<uint8_t> out(
      {static_cast<pybind11::ssize_t>(owned->size())}, {1},
      reinterpret_cast<const uint8_t*>(owned->data()), free_when_done);
  pybind11::detail::array_proxy(out.ptr())->flags &=
      ~pybind11::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return out;
}

// `b` as Bytes: shared without a copy when it is (a contiguous view into) an
// array that ToNumpy made, such as an upload taken from HostBuffers;
// copied otherwise.
inline Bytes SharedOrCopy(const pybind11::buffer& b) {
  BytesView view(b);
  pybind11::handle base = b;
  while (base && pybind11::isinstance<pybind11::array>(base)) {
    base = pybind11::detail::array_proxy(base.ptr())->base;
  }
  if (base && PyCapsule_IsValid(base.ptr(), kBytesCapsule)) {
    const auto* owner = static_cast<const Bytes*>(
        PyCapsule_GetPointer(base.ptr(), kBytesCapsule));
    const char* start = view.view().data();
    if (start >= owner->data() &&
        start + view.view().size() <= owner->data() + owner->size()) {
      return owner->Slice(start - owner->data(), view.view().size());
    }
  }
  return Bytes::Copy(view.view());
}

// Names the capsule that holds the pieces of one buffer (an upload as gRPC
// received it): Python carries one object however many pieces there are,
// and Dispatcher.submit takes the pieces as consecutive payload tails.
inline constexpr char kPiecesCapsule[] = "jax_pathways.Pieces";

inline pybind11::capsule PiecesToCapsule(std::vector<Bytes> pieces) {
  return pybind11::capsule(
      new std::vector<Bytes>(std::move(pieces)), kPiecesCapsule,
      [](PyObject* c) {
        delete static_cast<std::vector<Bytes>*>(
            PyCapsule_GetPointer(c, kPiecesCapsule));
      });
}

// The pieces in a capsule that PiecesToCapsule made, or nullptr.
inline const std::vector<Bytes>* PiecesInCapsule(pybind11::handle h) {
  if (!PyCapsule_IsValid(h.ptr(), kPiecesCapsule)) return nullptr;
  return static_cast<const std::vector<Bytes>*>(
      PyCapsule_GetPointer(h.ptr(), kPiecesCapsule));
}

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_PYTHON_BYTES_CASTERS_H_
