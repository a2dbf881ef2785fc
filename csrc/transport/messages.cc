#include "transport/messages.h"

#include "transport/wire.h"

namespace jax_pathways {

std::string EncodeOpHead(const Op& op) {
  WireWriter w;
  w.U32(static_cast<uint32_t>(op.kind));
  w.U64(op.seq);
  w.U64(op.program);
  w.Ids(op.args);
  w.Ids(op.results);
  w.PayloadSize(op.payload.size() + op.TailBytes());
  return w.Take();
}

Status DecodeOp(const Bytes& body, Op* op) {
  WireReader r(body.view());
  uint32_t kind;
  std::string_view payload;
  if (!r.U32(&kind) || !r.U64(&op->seq) || !r.U64(&op->program) ||
      !r.Ids(&op->args) || !r.Ids(&op->results) || !r.Payload(&payload) ||
      !r.AtEnd()) {
    return DataLoss("malformed op frame");
  }
  op->payload = body.Slice(payload.data() - body.data(), payload.size());
  if (kind < static_cast<uint32_t>(OpKind::kCompile) ||
      kind > static_cast<uint32_t>(kLastOpKind)) {
    return DataLoss("unknown op kind " + std::to_string(kind));
  }
  op->kind = static_cast<OpKind>(kind);
  return Status::Ok();
}

std::string EncodeEventHead(uint64_t seq, const Status& status,
                            size_t payload_size, uint64_t device_ns) {
  WireWriter w;
  w.U64(seq);
  w.I32(static_cast<int32_t>(status.code()));
  w.Bytes(status.message());
  w.U64(device_ns);
  w.PayloadSize(payload_size);
  return w.Take();
}

Status DecodeEvent(const Bytes& body, Event* event) {
  WireReader r(body.view());
  int32_t code;
  std::string message;
  std::string_view payload;
  if (!r.U64(&event->seq) || !r.I32(&code) || !r.Bytes(&message) ||
      !r.U64(&event->device_ns) || !r.Payload(&payload) || !r.AtEnd() ||
      code < 0 || code > 16 || event->device_ns > kMaxEventDeviceNs) {
    return DataLoss("malformed event frame");
  }
  event->payload = body.Slice(payload.data() - body.data(), payload.size());
  event->status = Status(static_cast<Code>(code), std::move(message));
  return Status::Ok();
}

}  // namespace jax_pathways
