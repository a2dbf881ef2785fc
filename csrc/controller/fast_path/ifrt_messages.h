// The IFRT-proxy requests of a training loop's steady state, as the fast
// path reads them, and its replies: Execute, CheckValueReady,
// DestructArray, a small read's FullyReplicatedShard, Disassemble and
// CopyToHostBuffer, and uploads (MakeArrayFromHostBuffer,
// MakeArraysFromHostBufferShards). Parsed and written by the protobuf
// classes protoc generates at build time from jaxlib's own schema (setup.py;
// jax_pathways/wire/descriptors.py names the messages and fields used): the
// one schema Python reads. A request that does not parse, or is another
// kind, reads as kOther and goes to Python, which answers it fully.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_FAST_PATH_IFRT_MESSAGES_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_FAST_PATH_IFRT_MESSAGES_H_

#include <cstdint>
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
  // FullyReplicatedShard, Disassemble: the shards share the array's buffer
  // (ArrayCopySemantics REUSE_INPUT, what JAX's client asks for).
  bool reuse_input = false;
  uint64_t host_buffer = 0;
  bool byte_strides = false;  // CopyToHostBuffer: the client gave strides
  // Uploads: the host buffers they name, in order, and the request without
  // its handles, serialized: requests alike in it make alike arrays.
  std::vector<uint64_t> uploads;
  std::string signature;
};

namespace ifrt_wire {

// The request in an IfrtRequest message; kind kOther if it is not one of
// the above, or not whole.
IfrtRequest Read(std::string_view message);

// The IfrtResponse answering request `op_id` of `kind`: if `status` is OK,
// a body naming `results` (the handles the request made), else the status
// in its metadata and no body (as the client reads errors).
std::string Reply(IfrtRequest::Kind kind, uint64_t op_id, const Status& status,
                  const std::vector<uint64_t>& results = {});

}  // namespace ifrt_wire
}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_FAST_PATH_IFRT_MESSAGES_H_
