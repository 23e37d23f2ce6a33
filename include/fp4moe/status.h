// Errors in fp4moe. Host code throws fp4moe::Error (a std::runtime_error carrying a code); the C++
// engine/tuner entry points that must never throw return fp4moe::Status instead. Every message
// names the problem: the file, the tensor, the shape, what was expected and what was found.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace fp4moe {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad shape, null pointer, inconsistent config
  kNotFound,         // missing file or tensor
  kIoError,          // open/read/write/rename failed
  kFormatError,      // malformed file contents (safetensors header, JSON, dtype/shape/size)
  kUnsupported,      // a device, dtype or shape this build cannot handle
  kCudaError,        // a CUDA runtime call failed
  kInternal,         // a bug in fp4moe
};

const char* status_code_name(StatusCode code);

class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  StatusCode code() const noexcept { return code_; }

 private:
  StatusCode code_;
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }
  static Status from_error(const Error& e) { return Status(e.code(), e.what()); }
  bool is_ok() const noexcept { return code_ == StatusCode::kOk; }
  explicit operator bool() const noexcept { return is_ok(); }
  StatusCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "InvalidArgument: <message>" or "Ok".
  std::string to_string() const;
  // Throws Error when not ok.
  void throw_if_error() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Runs f, converting an fp4moe::Error or std::exception into a Status. For API boundaries.
template <typename F>
Status status_from(F&& f) noexcept {
  try {
    f();
    return Status::ok();
  } catch (const Error& e) {
    return Status::from_error(e);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, e.what());
  } catch (...) {
    return Status(StatusCode::kInternal, "unknown exception");
  }
}

}  // namespace fp4moe

// FP4MOE_CHECK(cond, code, fmt-args...): throws fp4moe::Error with a formatted message when cond is false.
#define FP4MOE_CHECK(cond, code, ...)                                      \
  do {                                                                     \
    if (!(cond)) throw ::fp4moe::Error((code), ::fmt::format(__VA_ARGS__)); \
  } while (0)
