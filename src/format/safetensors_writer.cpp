// safetensors writer: tensors in insertion order with contiguous offsets, a compact JSON header
// ("__metadata__" first, then {"dtype", "shape", "data_offsets"} per tensor) padded with spaces to a
// multiple of 8 bytes as the reference implementation pads it, written to a temporary file in the
// destination's directory, fsync'ed and renamed over the destination (readers never see a partial file).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "fp4moe/safetensors.h"
#include "fp4moe/status.h"

namespace fp4moe {
namespace {

// A JSON string literal for s; kInvalidArgument when s is not valid UTF-8.
std::string json_quote(const std::string& s, const char* what) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kInvalidArgument, fmt::format("safetensors writer: {} is not valid UTF-8: {}", what, e.what()));
  }
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Writes all of [p, p+n) to fd; false on error (errno set).
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
                            size_t bytes) {
  FP4MOE_CHECK(name != "__metadata__", StatusCode::kInvalidArgument,
               "safetensors writer: '__metadata__' is reserved and cannot name a tensor");
  FP4MOE_CHECK(names_.count(name) == 0, StatusCode::kInvalidArgument,
               "safetensors writer: duplicate tensor name '{}' (already added as tensor #{})", name,
               names_.count(name) ? names_.at(name) : 0);
  FP4MOE_CHECK(dtype_size(dtype) != 0, StatusCode::kInvalidArgument, "safetensors writer: tensor '{}': unknown dtype {}",
               name, static_cast<int>(dtype));
  uint64_t numel = 1;
  for (int64_t d : shape) {
    FP4MOE_CHECK(d >= 0, StatusCode::kInvalidArgument, "safetensors writer: tensor '{}': negative dimension {}", name, d);
    FP4MOE_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) &&
                     numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 StatusCode::kInvalidArgument, "safetensors writer: tensor '{}': shape overflows", name);
  }
  uint64_t expect = 0;
  FP4MOE_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(dtype)), &expect),
               StatusCode::kInvalidArgument, "safetensors writer: tensor '{}': byte size overflows", name);
  TensorInfo shown;
  shown.shape = shape;
  FP4MOE_CHECK(expect == bytes, StatusCode::kInvalidArgument,
               "safetensors writer: tensor '{}': dtype {} x shape {} = {} bytes, but {} bytes were given", name,
               dtype_name(dtype), shown.shape_string(), expect, bytes);
  FP4MOE_CHECK(bytes == 0 || data != nullptr, StatusCode::kInvalidArgument,
               "safetensors writer: tensor '{}': null data for {} bytes", name, bytes);
  json_quote(name, "a tensor name");  // reject bad names now rather than at write()
  Entry e{name, dtype, std::move(shape), {}};
  if (bytes) e.bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
  names_[name] = entries_.size();
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::add_metadata(const std::string& key, const std::string& value) {
  json_quote(key, "a metadata key");
  json_quote(value, "a metadata value");
  metadata_[key] = value;  // a repeated key replaces the earlier value
}

void SafetensorsWriter::write(const std::string& path) const {
  // Header.
  std::string h = "{";
  bool first = true;
  if (!metadata_.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& kv : metadata_) {
      if (!first) h += ",";
      first = false;
      h += json_quote(kv.first, "a metadata key") + ":" + json_quote(kv.second, "a metadata value");
    }
    h += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    if (!first) h += ",";
    first = false;
    h += json_quote(e.name, "a tensor name") + ":{\"dtype\":\"" + dtype_name(e.dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) h += (i ? "," : "") + std::to_string(e.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + e.bytes.size()) + "]}";
    offset += e.bytes.size();
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');
  FP4MOE_CHECK(h.size() <= kSafetensorsMaxHeaderBytes, StatusCode::kInvalidArgument,
               "{}: header would be {} bytes, over the {} byte limit readers enforce", path, h.size(),
               kSafetensorsMaxHeaderBytes);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));

  // Temporary file next to the destination, then fsync + rename.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, static_cast<long>(::getpid()), counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  FP4MOE_CHECK(fd >= 0, StatusCode::kIoError, "{}: cannot create temporary file {}: {}", path, tmp,
               std::strerror(errno));
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(StatusCode::kIoError, fmt::format("{}: {} failed while writing {}: {}", path, what, tmp,
                                                  std::strerror(err)));
  };
  if (!write_all(fd, len, 8) || !write_all(fd, h.data(), h.size())) fail("write");
  for (const Entry& e : entries_)
    if (!e.bytes.empty() && !write_all(fd, e.bytes.data(), e.bytes.size())) fail("write");
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(StatusCode::kIoError, fmt::format("{}: close of {} failed: {}", path, tmp, std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(StatusCode::kIoError, fmt::format("{}: rename from {} failed: {}", path, tmp, std::strerror(err)));
  }
  // Make the rename itself durable (best effort: some filesystems refuse fsync on a directory).
  const int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace fp4moe
