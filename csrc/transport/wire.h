// Little-endian encoding of the integers, id lists and byte strings that make
// up a frame body. Decoding is bounds-checked: a truncated or corrupt body
// from a peer yields a DataLoss status, never a crash.
#ifndef JAX_PATHWAYS_CSRC_TRANSPORT_WIRE_H_
#define JAX_PATHWAYS_CSRC_TRANSPORT_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace jax_pathways {

class WireWriter {
 public:
  void U32(uint32_t v) { Raw(&v, sizeof(v)); }
  void U64(uint64_t v) { Raw(&v, sizeof(v)); }
  void I32(int32_t v) { Raw(&v, sizeof(v)); }
  void Bytes(std::string_view s) {
    U64(s.size());
    out_.append(s.data(), s.size());
  }
  void Ids(const std::vector<uint64_t>& ids) {
    U64(ids.size());
    Raw(ids.data(), ids.size() * sizeof(uint64_t));
  }
  // Ends a frame head whose payload (of `payload_size` bytes) follows it:
  // pads the head to a multiple of `align` bytes first, so a payload
  // received into an aligned buffer is aligned too (a device can then alias
  // it instead of copying).
  void PayloadSize(uint64_t payload_size, size_t align = 64) {
    size_t used = out_.size() + sizeof(uint32_t) + sizeof(uint64_t);
    uint32_t pad = static_cast<uint32_t>((align - used % align) % align);
    U32(pad);
    out_.append(pad, '\0');
    U64(payload_size);
  }
  std::string Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
  }
  std::string out_;
};

class WireReader {
 public:
  explicit WireReader(std::string_view in) : in_(in) {}

  bool U32(uint32_t* v) { return Raw(v, sizeof(*v)); }
  bool U64(uint64_t* v) { return Raw(v, sizeof(*v)); }
  bool I32(int32_t* v) { return Raw(v, sizeof(*v)); }
  bool Bytes(std::string* s) {
    std::string_view v;
    if (!View(&v)) return false;
    s->assign(v.data(), v.size());
    return true;
  }
  // The payload after a head written with WireWriter::PayloadSize().
  bool Payload(std::string_view* v) {
    uint32_t pad;
    return U32(&pad) && Skip(pad) && View(v);
  }
  // A length-prefixed byte string, as a view into the input.
  bool View(std::string_view* v) {
    uint64_t n;
    if (!U64(&n) || n > in_.size() - pos_) return false;
    *v = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool Ids(std::vector<uint64_t>* ids) {
    uint64_t n;
    if (!U64(&n) || n > (in_.size() - pos_) / sizeof(uint64_t)) return false;
    ids->resize(n);
    return Raw(ids->data(), n * sizeof(uint64_t));
  }
  bool Skip(size_t n) {
    if (n > in_.size() - pos_) return false;
    pos_ += n;
    return true;
  }
  bool AtEnd() const { return pos_ == in_.size(); }

 private:
  bool Raw(void* p, size_t n) {
    if (n > in_.size() - pos_) return false;
    if (n) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_TRANSPORT_WIRE_H_
