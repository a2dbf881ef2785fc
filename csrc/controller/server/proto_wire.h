// The few protobuf wire fields the frontend reads and writes itself.
//
// The host-buffer side channel carries bulk bytes that never need Python:
// its request messages are flat (fixed64 ids, an int64 size) and its reply
// is one bytes field. Everything else in the IFRT-proxy protocol is parsed
// by Python from jaxlib's own schema.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_PROTO_WIRE_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_PROTO_WIRE_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

namespace jax_pathways {

// Scalar fields of a flat message: field number -> value (varint or fixed64).
// Returns false on malformed input. Length-delimited fields are skipped.
inline bool ReadScalarFields(std::string_view in,
                             std::map<uint32_t, uint64_t>* out) {
  size_t i = 0;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= in.size()) return false;
      uint8_t b = static_cast<uint8_t>(in[i++]);
      *v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  while (i < in.size()) {
    uint64_t tag;
    if (!varint(&tag)) return false;
    uint32_t field = static_cast<uint32_t>(tag >> 3);
    switch (tag & 7) {
      case 0: {
        uint64_t v;
        if (!varint(&v)) return false;
        (*out)[field] = v;
        break;
      }
      case 1: {
        if (in.size() - i < 8) return false;
        uint64_t v;
        std::memcpy(&v, in.data() + i, 8);
        i += 8;
        (*out)[field] = v;
        break;
      }
      case 2: {
        uint64_t n;
        if (!varint(&n) || n > in.size() - i) return false;
        i += n;
        break;
      }
      case 5:
        if (in.size() - i < 4) return false;
        i += 4;
        break;
      default:
        return false;
    }
  }
  return true;
}

// The size of the tag and length that start `head`, the beginning of a
// `total`-byte message, when the message is exactly one bytes field
// `field`; 0 otherwise (other fields, or a head too short to tell).
inline size_t FieldHeadSize(std::string_view head, uint32_t field,
                            size_t total) {
  size_t i = 0;
  uint64_t values[2] = {0, 0};
  for (uint64_t& v : values) {
    for (int shift = 0;; shift += 7) {
      if (i >= head.size() || shift > 63) return 0;
      uint8_t b = static_cast<uint8_t>(head[i++]);
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) break;
    }
  }
  bool one_field = values[0] == ((uint64_t{field} << 3) | 2) &&
                   values[1] == total - i;
  return one_field ? i : 0;
}

// Field 1 (bytes) of a message like GrpcHostBufferStoreRequest; an empty
// message means empty bytes. Returns false on malformed input.
inline bool ReadBytesField1(std::string_view in, std::string_view* out) {
  *out = std::string_view();
  size_t i = 0;
  while (i < in.size()) {
    uint64_t tag = 0, n = 0;
    int shift = 0;
    do {
      if (i >= in.size() || shift > 63) return false;
      tag |= uint64_t{static_cast<uint8_t>(in[i]) & 0x7fu} << shift;
      shift += 7;
    } while (static_cast<uint8_t>(in[i++]) & 0x80);
    if ((tag & 7) != 2) return false;  // only bytes fields are expected
    shift = 0;
    do {
      if (i >= in.size() || shift > 63) return false;
      n |= uint64_t{static_cast<uint8_t>(in[i]) & 0x7fu} << shift;
      shift += 7;
    } while (static_cast<uint8_t>(in[i++]) & 0x80);
    if (n > in.size() - i) return false;
    if ((tag >> 3) == 1) *out = in.substr(i, n);
    i += n;
  }
  return true;
}

// The start of a message whose field 1 is `size` bytes (e.g. a
// GrpcHostBufferLookupResponse): the bytes themselves follow it.
inline std::string BytesField1Head(uint64_t size) {
  std::string out(1, '\x0a');
  do {
    uint8_t b = size & 0x7f;
    size >>= 7;
    out.push_back(static_cast<char>(size ? (b | 0x80) : b));
  } while (size);
  return out;
}

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_PROTO_WIRE_H_
