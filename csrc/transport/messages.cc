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
  w.U64(op.payload.size());
  return w.Take();
}

Status DecodeOp(const std::string& body, Op* op) {
  WireReader r(body);
  uint32_t kind;
  if (!r.U32(&kind) || !r.U64(&op->seq) || !r.U64(&op->program) ||
      !r.Ids(&op->args) || !r.Ids(&op->results) || !r.Bytes(&op->payload) ||
      !r.AtEnd()) {
    return DataLoss("malformed op frame");
  }
  if (kind < static_cast<uint32_t>(OpKind::kCompile) ||
      kind > static_cast<uint32_t>(OpKind::kShutdown)) {
    return DataLoss("unknown op kind " + std::to_string(kind));
  }
  op->kind = static_cast<OpKind>(kind);
  return Status::Ok();
}

std::string EncodeEventHead(uint64_t seq, const Status& status,
                            size_t payload_size) {
  WireWriter w;
  w.U64(seq);
  w.I32(static_cast<int32_t>(status.code()));
  w.Bytes(status.message());
  w.U64(payload_size);
  return w.Take();
}

Status DecodeEvent(const std::string& body, Event* event) {
  WireReader r(body);
  int32_t code;
  std::string message;
  if (!r.U64(&event->seq) || !r.I32(&code) || !r.Bytes(&message) ||
      !r.Bytes(&event->payload) || !r.AtEnd() || code < 0 || code > 16) {
    return DataLoss("malformed event frame");
  }
  event->status = Status(static_cast<Code>(code), std::move(message));
  return Status::Ok();
}

}  // namespace jax_pathways
