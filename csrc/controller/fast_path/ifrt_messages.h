// The IFRT-proxy requests of a training loop's steady state, read straight
// from the wire, and their replies written back: Execute, CheckValueReady,
// DestructArray, a small read's FullyReplicatedShard and CopyToHostBuffer,
// and uploads (MakeArrayFromHostBuffer, MakeArraysFromHostBufferShards)
// (field numbers from jaxlib's ifrt_service.proto; Python reads every other
// request with jaxlib's own schema). A message that does not parse, or
// parses as something else, reads as kOther and goes to Python, which
// answers it fully.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_FAST_PATH_IFRT_MESSAGES_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_FAST_PATH_IFRT_MESSAGES_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace jax_pathways {

struct IfrtRequest {
  enum Kind {
    kOther,
    kExecute,
    kCheckValueReady,
    kDestructArray,
    kFullyReplicatedShard,
    kDisassemble,
    kCopyToHostBuffer,
    kMakeArray,   // MakeArrayFromHostBuffer
    kMakeArrays,  // MakeArraysFromHostBufferShards
  };
  Kind kind = kOther;
  uint64_t op_id = 0;
  // Execute: the executable, its arguments and the client's result handles;
  // CheckValueReady / DestructArray: the arrays (in `args`);
  // FullyReplicatedShard / DisassembleIntoSingleDeviceArrays: the array
  // (args[0]), its shards' handles (`results`); CopyToHostBuffer: the array
  // (args[0]), the host buffer's handle (`host_buffer`); uploads: the new
  // arrays (`results`).
  uint64_t executable = 0;
  std::vector<uint64_t> args;
  std::vector<uint64_t> results;
  uint64_t status_handle = 0;
  bool fill_status = false;
  // FullyReplicatedShard, Disassemble: ArrayCopySemantics (2: REUSE_INPUT).
  uint64_t copy_semantics = 0;
  uint64_t host_buffer = 0;
  bool byte_strides = false;  // CopyToHostBuffer: the client gave strides
  // Uploads: the host buffers they name, in order, and every other field's
  // bytes (dtype, shape, sharding, strides, layout, shard indices), in an
  // encoding one-to-one with them: requests alike in these make alike
  // arrays.
  std::vector<uint64_t> uploads;
  std::string signature;
};

namespace ifrt_wire {

// One field of a message: a scalar (`value`) or a length-delimited body.
struct Field {
  uint32_t number = 0;
  uint32_t type = 0;
  uint64_t value = 0;
  std::string_view body;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  // The next field; false at the end or on malformed input (then !ok()).
  bool Next(Field* f) {
    if (i_ >= in_.size()) return false;
    uint64_t tag;
    if (!Varint(&tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff) {
      return Fail();
    }
    f->number = static_cast<uint32_t>(tag >> 3);
    f->type = static_cast<uint32_t>(tag & 7);
    switch (f->type) {
      case 0:
        return Varint(&f->value) || Fail();
      case 1:
        return Fixed(8, &f->value) || Fail();
      case 5:
        return Fixed(4, &f->value) || Fail();
      case 2: {
        uint64_t n;
        if (!Varint(&n) || n > in_.size() - i_) return Fail();
        f->body = in_.substr(i_, n);
        i_ += n;
        return true;
      }
      default:
        return Fail();
    }
  }
  bool ok() const { return ok_; }
  size_t pos() const { return i_; }  // where the next field starts

 private:
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i_ >= in_.size()) return false;
      uint8_t b = static_cast<uint8_t>(in_[i_++]);
      *v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  bool Fixed(size_t n, uint64_t* v) {
    if (in_.size() - i_ < n) return false;
    *v = 0;
    std::memcpy(v, in_.data() + i_, n);  // little-endian hosts only
    i_ += n;
    return true;
  }
  bool Fail() {
    ok_ = false;
    return false;
  }
  std::string_view in_;
  size_t i_ = 0;
  bool ok_ = true;
};

// A repeated fixed64 field's value(s): one element, or a packed run.
inline bool AppendFixed64(const Field& f, std::vector<uint64_t>* out) {
  if (f.type == 1) {
    out->push_back(f.value);
    return true;
  }
  if (f.type != 2 || f.body.size() % 8 != 0) return false;
  for (size_t i = 0; i < f.body.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, f.body.data() + i, 8);
    out->push_back(v);
  }
  return true;
}

inline bool ReadExecute(std::string_view body, IfrtRequest* r) {
  Reader in(body);
  Field f;
  while (in.Next(&f)) {
    switch (f.number) {
      case 1:  // loaded_executable_handle
        if (f.type != 1) return false;
        r->executable = f.value;
        break;
      case 2:  // args_handles
        if (!AppendFixed64(f, &r->args)) return false;
        break;
      case 3: {  // execute_options: only fill_status matters here
        if (f.type != 2) return false;
        Reader options(f.body);
        Field o;
        while (options.Next(&o)) {
          if (o.number == 9 && o.type == 0) r->fill_status = o.value != 0;
        }
        if (!options.ok()) return false;
        break;
      }
      case 5:  // result_array_handle
        if (!AppendFixed64(f, &r->results)) return false;
        break;
      case 6:  // result_status_handle
        if (f.type != 1) return false;
        r->status_handle = f.value;
        break;
      default:  // device_ids, and fields newer than this reader
        break;
    }
  }
  return in.ok();
}

// FullyReplicatedShard (result_handle: field 3) and
// DisassembleIntoSingleDeviceArrays (result_handles: field 4; field 3 is
// single_device_shard_semantics, of no matter here: every shard of an array
// the fast path holds is addressable).
inline bool ReadSplit(std::string_view body, uint32_t results_field,
                      IfrtRequest* r) {
  Reader in(body);
  Field f;
  while (in.Next(&f)) {
    if (f.number == 1) {  // array_handle
      if (f.type != 1) return false;
      r->args.push_back(f.value);
    } else if (f.number == 2) {  // copy_semantics
      if (f.type != 0) return false;
      r->copy_semantics = f.value;
    } else if (f.number == results_field) {
      if (!AppendFixed64(f, &r->results)) return false;
    }
  }
  return in.ok() && r->args.size() == 1 && !r->results.empty();
}

inline bool ReadCopyToHostBuffer(std::string_view body, IfrtRequest* r) {
  Reader in(body);
  Field f;
  bool has_host_buffer = false;
  while (in.Next(&f)) {
    switch (f.number) {
      case 1:  // host_buffer_handle
        if (f.type != 1) return false;
        r->host_buffer = f.value;
        has_host_buffer = true;
        break;
      case 2:  // array_handle
        if (f.type != 1) return false;
        r->args.push_back(f.value);
        break;
      case 3:  // byte_strides
        r->byte_strides = true;
        break;
      default:
        break;
    }
  }
  return in.ok() && r->args.size() == 1 && has_host_buffer;
}

inline bool ReadMakeArray(std::string_view body, IfrtRequest* r) {
  Reader in(body);
  Field f;
  size_t start = 0;
  while (in.Next(&f)) {
    if (f.number == 4 && f.type == 1) {  // host_buffer_handle
      r->uploads.push_back(f.value);
    } else if (f.number == 6 && f.type == 1) {  // array_handle
      r->results.push_back(f.value);
    } else {  // each field's bytes: tag and length delimit them
      r->signature.append(body.substr(start, in.pos() - start));
    }
    start = in.pos();
  }
  return in.ok() && r->uploads.size() == 1 && r->results.size() == 1;
}

inline void PutVarint(uint64_t v, std::string* out) {
  do {
    uint8_t b = v & 0x7f;
    v >>= 7;
    out->push_back(static_cast<char>(v ? (b | 0x80) : b));
  } while (v);
}

inline void PutBody(uint32_t field, std::string_view body, std::string* out) {
  PutVarint((uint64_t{field} << 3) | 2, out);
  PutVarint(body.size(), out);
  out->append(body);
}

// A MakeArraysFromHostBufferShards spec (field 1 of the request): its
// HostBuffers' (field 2) host_buffer_handle (field 3) go to `uploads`, one
// each, the rest to `signature`, each HostBuffer re-delimited without its
// handle.
inline bool ReadShardsSpec(std::string_view body, IfrtRequest* r) {
  Reader in(body);
  Field f;
  size_t start = 0;
  while (in.Next(&f)) {
    if (f.number == 2 && f.type == 2) {  // a HostBuffer
      Reader hb(f.body);
      Field h;
      size_t from = 0;
      size_t handles = 0;
      std::string rest;
      while (hb.Next(&h)) {
        if (h.number == 3 && h.type == 1) {
          r->uploads.push_back(h.value);
          ++handles;
        } else {
          rest.append(f.body.substr(from, hb.pos() - from));
        }
        from = hb.pos();
      }
      if (!hb.ok() || handles != 1) return false;
      PutBody(2, rest, &r->signature);
    } else {
      r->signature.append(body.substr(start, in.pos() - start));
    }
    start = in.pos();
  }
  return in.ok();
}

inline bool ReadMakeArrays(std::string_view body, IfrtRequest* r) {
  Reader in(body);
  Field f;
  size_t specs = 0;
  while (in.Next(&f)) {
    if (f.number == 1 && f.type == 2) {  // a spec, re-delimited
      std::string outer;
      outer.swap(r->signature);
      if (!ReadShardsSpec(f.body, r)) return false;
      std::string spec;
      spec.swap(r->signature);
      r->signature = std::move(outer);
      PutBody(1, spec, &r->signature);
      ++specs;
    } else if (f.number == 2) {  // array_handles
      if (!AppendFixed64(f, &r->results)) return false;
    } else {  // a field newer than this reader: Python's to judge
      return false;
    }
  }
  return in.ok() && specs > 0 && r->results.size() == specs;
}

// Handles in field `number` of `body` (the only field it reads).
inline bool ReadHandles(std::string_view body, uint32_t number,
                        std::vector<uint64_t>* out) {
  Reader in(body);
  Field f;
  while (in.Next(&f)) {
    if (f.number == number && !AppendFixed64(f, out)) return false;
  }
  return in.ok();
}

// IfrtRequest field numbers of the bodies read here; also the IfrtResponse
// field of each one's response.
// ArrayCopySemantics REUSE_INPUT: a shard shares the array's buffer (what
// JAX's client asks for).
constexpr uint64_t kReuseInput = 2;

constexpr uint32_t kMetadata = 1;
constexpr uint32_t kMakeArrayField = 4;
constexpr uint32_t kCopyToHostBufferField = 6;
constexpr uint32_t kDisassembleField = 7;
constexpr uint32_t kCheckValueReadyField = 8;
constexpr uint32_t kDestructArrayField = 12;
constexpr uint32_t kExecuteField = 15;
constexpr uint32_t kFullyReplicatedShardField = 20;
constexpr uint32_t kMakeArraysField = 25;

inline IfrtRequest Read(std::string_view message) {
  IfrtRequest r;
  Reader in(message);
  Field f;
  std::string_view body;
  uint32_t body_field = 0;
  int bodies = 0;
  while (in.Next(&f)) {
    if (f.type != 2) continue;
    if (f.number == kMetadata) {
      Reader meta(f.body);
      Field m;
      while (meta.Next(&m)) {
        if (m.number == 1 && m.type == 1) r.op_id = m.value;
      }
      if (!meta.ok()) return IfrtRequest();
    } else {
      ++bodies;
      body_field = f.number;
      body = f.body;
    }
  }
  if (!in.ok() || bodies != 1) return IfrtRequest();
  bool read = false;
  switch (body_field) {
    case kExecuteField:
      r.kind = IfrtRequest::kExecute;
      read = ReadExecute(body, &r);
      break;
    case kCheckValueReadyField:
      r.kind = IfrtRequest::kCheckValueReady;
      read = ReadHandles(body, 1, &r.args);
      break;
    case kDestructArrayField:
      r.kind = IfrtRequest::kDestructArray;
      read = ReadHandles(body, 2, &r.args);
      break;
    case kFullyReplicatedShardField:
      r.kind = IfrtRequest::kFullyReplicatedShard;
      read = ReadSplit(body, 3, &r) && r.results.size() == 1;
      break;
    case kDisassembleField:
      r.kind = IfrtRequest::kDisassemble;
      read = ReadSplit(body, 4, &r);
      break;
    case kMakeArrayField:
      r.kind = IfrtRequest::kMakeArray;
      read = ReadMakeArray(body, &r);
      break;
    case kMakeArraysField:
      r.kind = IfrtRequest::kMakeArrays;
      read = ReadMakeArrays(body, &r);
      break;
    case kCopyToHostBufferField:
      r.kind = IfrtRequest::kCopyToHostBuffer;
      read = ReadCopyToHostBuffer(body, &r);
      break;
    default:
      break;
  }
  return read ? r : IfrtRequest();
}

// The IfrtResponse answering `op_id`: `body` in `field` if `status` is OK;
// else the status in its metadata and no body (as the client reads errors).
inline std::string Reply(uint64_t op_id, uint32_t field, const Status& status,
                         const std::string& body = "") {
  std::string meta(1, '\x09');  // op_id: field 1, fixed64
  meta.append(reinterpret_cast<const char*>(&op_id), 8);
  if (!status.ok()) {
    std::string proto;
    PutVarint(0x08, &proto);  // code
    PutVarint(static_cast<uint64_t>(status.code()), &proto);
    PutBody(2, status.message(), &proto);
    PutBody(2, proto, &meta);
  }
  std::string out;
  PutBody(kMetadata, meta, &out);
  if (status.ok()) PutBody(field, body, &out);
  return out;
}

// A response body holding one handle in (singular) fixed64 field `number`.
inline std::string HandleBody(uint32_t number, uint64_t handle) {
  std::string out;
  PutVarint((uint64_t{number} << 3) | 1, &out);
  out.append(reinterpret_cast<const char*>(&handle), 8);
  return out;
}

// A response body holding handles in repeated fixed64 field `number`
// (packed).
inline std::string HandlesBody(uint32_t number,
                               const std::vector<uint64_t>& handles) {
  std::string packed;
  for (uint64_t h : handles) {
    packed.append(reinterpret_cast<const char*>(&h), 8);
  }
  std::string out;
  PutBody(number, packed, &out);
  return out;
}

}  // namespace ifrt_wire
}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_FAST_PATH_IFRT_MESSAGES_H_
