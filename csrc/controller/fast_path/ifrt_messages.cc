#include "controller/fast_path/ifrt_messages.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <limits>

#include "xla/python/ifrt_proxy/common/ifrt_service.pb.h"

namespace jax_pathways {
namespace ifrt_wire {
namespace {

namespace proxy = ::xla::ifrt::proxy;

template <typename Repeated>
std::vector<uint64_t> Handles(const Repeated& handles) {
  return std::vector<uint64_t>(handles.begin(), handles.end());
}

bool ReadExecute(const proxy::LoadedExecutableExecuteRequest& m,
                 IfrtRequest* r) {
  r->executable = m.loaded_executable_handle();
  r->args = Handles(m.args_handles());
  r->fill_status = m.execute_options().fill_status();
  r->results = Handles(m.result_array_handle());
  r->status_handle = m.result_status_handle();
  return true;
}

// FullyReplicatedShard and DisassembleIntoSingleDeviceArrays (every shard
// of an array the fast path holds is addressable: the latter's
// single_device_shard_semantics is of no matter here).
template <typename Split>
bool ReadSplit(const Split& m, std::vector<uint64_t> results,
               IfrtRequest* r) {
  r->args = {m.array_handle()};
  r->reuse_input =
      m.copy_semantics() == ::xla::ifrt::proto::ARRAY_COPY_SEMANTICS_REUSE_INPUT;
  r->results = std::move(results);
  return m.array_handle() != 0 && !r->results.empty();
}

bool ReadCopyToHostBuffer(const proxy::CopyToHostBufferRequest& m,
                          IfrtRequest* r) {
  r->args = {m.array_handle()};
  r->host_buffer = m.host_buffer_handle();
  r->byte_strides = m.has_byte_strides();
  return m.array_handle() != 0 && m.host_buffer_handle() != 0;
}

bool ReadMakeArray(const proxy::MakeArrayFromHostBufferRequest& m,
                   IfrtRequest* r) {
  r->uploads = {m.host_buffer_handle()};
  r->results = {m.array_handle()};
  proxy::MakeArrayFromHostBufferRequest rest = m;
  rest.clear_host_buffer_handle();
  rest.clear_array_handle();
  r->signature = rest.SerializeAsString();
  return m.host_buffer_handle() != 0 && m.array_handle() != 0;
}

bool ReadMakeArrays(const proxy::MakeArraysFromHostBufferShardsRequest& m,
                    IfrtRequest* r) {
  proxy::MakeArraysFromHostBufferShardsRequest rest = m;
  for (auto& spec : *rest.mutable_specs()) {
    for (auto& buffer : *spec.mutable_host_buffers()) {
      if (buffer.host_buffer_handle() == 0) return false;
      r->uploads.push_back(buffer.host_buffer_handle());
      buffer.clear_host_buffer_handle();
    }
  }
  r->results = Handles(m.array_handles());
  rest.clear_array_handles();
  r->signature = rest.SerializeAsString();
  return m.specs_size() > 0 &&
         r->results.size() == static_cast<size_t>(m.specs_size());
}

bool ReadBody(const proxy::IfrtRequest& m, IfrtRequest* r) {
  using M = proxy::IfrtRequest;
  switch (m.request_case()) {
    case M::kLoadedExecutableExecuteRequest:
      r->kind = IfrtRequest::kExecute;
      return ReadExecute(m.loaded_executable_execute_request(), r);
    case M::kCheckValueReadyRequest:
      r->kind = IfrtRequest::kCheckValueReady;
      r->args = Handles(m.check_value_ready_request().value_handles());
      return true;
    case M::kDestructArrayRequest:
      r->kind = IfrtRequest::kDestructArray;
      r->args = Handles(m.destruct_array_request().array_handle());
      return true;
    case M::kFullyReplicatedShardRequest: {
      const auto& split = m.fully_replicated_shard_request();
      r->kind = IfrtRequest::kFullyReplicatedShard;
      return split.result_handle() != 0 &&
             ReadSplit(split, {split.result_handle()}, r);
    }
    case M::kDisassembleIntoSingleDeviceArraysRequest: {
      const auto& split = m.disassemble_into_single_device_arrays_request();
      r->kind = IfrtRequest::kDisassemble;
      return ReadSplit(split, Handles(split.result_handles()), r);
    }
    case M::kCopyToHostBufferRequest:
      r->kind = IfrtRequest::kCopyToHostBuffer;
      return ReadCopyToHostBuffer(m.copy_to_host_buffer_request(), r);
    case M::kMakeArrayFromHostBufferRequest:
      r->kind = IfrtRequest::kMakeArray;
      return ReadMakeArray(m.make_array_from_host_buffer_request(), r);
    case M::kMakeArraysFromHostBufferShardsRequest:
      r->kind = IfrtRequest::kMakeArrays;
      return ReadMakeArrays(m.make_arrays_from_host_buffer_shards_request(),
                            r);
    case M::REQUEST_NOT_SET:
      return false;
  }
  return false;
}

// Whether every top-level field of `message` is one the C++ schema knows.
// It holds only the kinds above: any other request (a compile's program, a
// large upload's bytes), or a field newer than jaxlib's schema, is Python's
// whole, and is skipped here, not copied, on the thread every session's
// requests share.
bool OnlyKnownKinds(std::string_view message) {
  using google::protobuf::internal::WireFormatLite;
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(message.data()),
      static_cast<int>(message.size()));
  const google::protobuf::Descriptor* request = proxy::IfrtRequest::descriptor();
  while (uint32_t tag = in.ReadTag()) {
    if (request->FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag)) ==
            nullptr ||
        !WireFormatLite::SkipField(&in, tag)) {
      return false;
    }
  }
  return in.ConsumedEntireMessage();
}

}  // namespace

IfrtRequest Read(std::string_view message) {
  if (message.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !OnlyKnownKinds(message)) {
    return IfrtRequest();
  }
  proxy::IfrtRequest m;
  if (!m.ParseFromArray(message.data(), static_cast<int>(message.size()))) {
    return IfrtRequest();
  }
  IfrtRequest r;
  r.op_id = m.request_metadata().op_id();
  return ReadBody(m, &r) ? r : IfrtRequest();
}

std::string Reply(IfrtRequest::Kind kind, uint64_t op_id, const Status& status,
                  const std::vector<uint64_t>& results) {
  proxy::IfrtResponse m;
  m.mutable_response_metadata()->set_op_id(op_id);
  if (!status.ok()) {
    auto* error = m.mutable_response_metadata()->mutable_status();
    error->set_code(static_cast<::tensorflow::error::Code>(status.code()));
    error->set_message(status.message());
    return m.SerializeAsString();
  }
  switch (kind) {
    case IfrtRequest::kExecute:
      m.mutable_loaded_executable_execute_response();
      break;
    case IfrtRequest::kCheckValueReady:
      m.mutable_check_value_ready_response();
      break;
    case IfrtRequest::kDestructArray:
      m.mutable_destruct_array_response();
      break;
    case IfrtRequest::kFullyReplicatedShard:
      m.mutable_fully_replicated_shard_response()->set_array_handle(
          results.at(0));
      break;
    case IfrtRequest::kDisassemble:
      m.mutable_disassemble_into_single_device_arrays_response()
          ->mutable_array_handles()
          ->Add(results.begin(), results.end());
      break;
    case IfrtRequest::kCopyToHostBuffer:
      m.mutable_copy_to_host_buffer_response();
      break;
    case IfrtRequest::kMakeArray:
      m.mutable_make_array_from_host_buffer_response()->set_array_handle(
          results.at(0));
      break;
    case IfrtRequest::kMakeArrays:
      m.mutable_make_arrays_from_host_buffer_shards_response()
          ->mutable_array_handles()
          ->Add(results.begin(), results.end());
      break;
    case IfrtRequest::kOther:
      break;
  }
  return m.SerializeAsString();
}

}  // namespace ifrt_wire
}  // namespace jax_pathways
