// The bulk-bytes field of the host-buffer side channel's messages
// (GrpcHostBufferStoreRequest and GrpcHostBufferLookupResponse: `data`,
// their only field), framed around bytes that stay where they are: an
// upload's gRPC slices become the buffer's pieces and a download's pieces
// go out as slices, neither copied into or out of a message. Tags come from
// the protobuf classes protoc generates from jaxlib's schema (setup.py); the
// rest of each message is parsed by them whole.
#ifndef JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_HOST_BUFFER_MESSAGES_H_
#define JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_HOST_BUFFER_MESSAGES_H_

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "xla/python/ifrt_proxy/common/grpc_ifrt_service.pb.h"

namespace jax_pathways {

// The tag of a message's `data` field (number 1 in both messages).
inline uint32_t DataTag() {
  using google::protobuf::internal::WireFormatLite;
  static_assert(
      int{xla::ifrt::proxy::GrpcHostBufferStoreRequest::kDataFieldNumber} ==
      int{xla::ifrt::proxy::GrpcHostBufferLookupResponse::kDataFieldNumber});
  return WireFormatLite::MakeTag(
      xla::ifrt::proxy::GrpcHostBufferStoreRequest::kDataFieldNumber,
      WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}

// The size of the tag and length that start `head`, the beginning of a
// `total`-byte message, when the message is its `data` field alone; 0
// otherwise (other fields, or a head too short to tell).
inline size_t DataHeadSize(std::string_view head, size_t total) {
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(head.data()),
      static_cast<int>(std::min<size_t>(head.size(), 32)));
  uint64_t size = 0;
  if (in.ReadTag() != DataTag() || !in.ReadVarint64(&size)) return 0;
  size_t at = static_cast<size_t>(in.CurrentPosition());
  return size == total - at ? at : 0;
}

// The tag and length of a `data` field of `size` bytes: the bytes follow.
inline std::string DataHead(uint64_t size) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(DataTag());
    coded.WriteVarint64(size);
  }
  return out;
}

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_CONTROLLER_SERVER_HOST_BUFFER_MESSAGES_H_
