#include "fp4moe/status.h"

namespace fp4moe {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "Ok";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kFormatError: return "FormatError";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kCudaError: return "CudaError";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "Ok";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

void Status::throw_if_error() const {
  if (!is_ok()) throw Error(code_, message_);
}

}  // namespace fp4moe
