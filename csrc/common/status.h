// Status and StatusOr: error values for the C++ core.
//
// Codes use the absl/gRPC numbering so that Python can put them unchanged into
// the IFRT proxy's tensorflow.StatusProto. The core never throws or aborts on
// input from a peer; every failure travels as a Status.
#ifndef JAX_PATHWAYS_CSRC_COMMON_STATUS_H_
#define JAX_PATHWAYS_CSRC_COMMON_STATUS_H_

#include <string>
#include <utility>
#include <variant>

namespace jax_pathways {

enum class Code : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return Status(Code::kInvalidArgument, std::move(m));
}
inline Status NotFound(std::string m) {
  return Status(Code::kNotFound, std::move(m));
}
inline Status Unavailable(std::string m) {
  return Status(Code::kUnavailable, std::move(m));
}
inline Status Internal(std::string m) {
  return Status(Code::kInternal, std::move(m));
}
inline Status DataLoss(std::string m) {
  return Status(Code::kDataLoss, std::move(m));
}
inline Status DeadlineExceeded(std::string m) {
  return Status(Code::kDeadlineExceeded, std::move(m));
}
inline Status Cancelled(std::string m) {
  return Status(Code::kCancelled, std::move(m));
}

// A value or the Status that explains its absence.
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}         // NOLINT: implicit
  StatusOr(Status status) : v_(std::move(status)) {}  // NOLINT: implicit

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const {
    return ok() ? Status::Ok() : std::get<Status>(v_);
  }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace jax_pathways

#endif  // JAX_PATHWAYS_CSRC_COMMON_STATUS_H_
