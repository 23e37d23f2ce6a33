#include "format/safetensors_json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "fp4moe/status.h"

namespace fp4moe {
namespace detail {

nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& origin, int max_depth) {
  // keys[d] holds the keys seen so far in the object whose members sit at depth d.
  std::vector<std::set<std::string>> keys;
  auto cb = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) -> bool {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start || event == E::array_start) {
      FP4MOE_CHECK(depth < max_depth, StatusCode::kFormatError,
                   "{}: JSON nested deeper than {} levels; this file's format never nests that deep", origin,
                   max_depth);
      if (event == E::object_start) {
        if (keys.size() < static_cast<size_t>(depth) + 2) keys.resize(static_cast<size_t>(depth) + 2);
        keys[static_cast<size_t>(depth) + 1].clear();
      }
    } else if (event == E::key) {
      const size_t d = static_cast<size_t>(depth);
      if (keys.size() <= d) keys.resize(d + 1);
      const std::string& k = parsed.get_ref<const std::string&>();
      FP4MOE_CHECK(keys[d].insert(k).second, StatusCode::kFormatError,
                   "{}: duplicate key '{}' in a JSON object (each name must appear once)", origin, k);
    }
    return true;
  };
  try {
    return nlohmann::json::parse(begin, end, cb, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    throw Error(StatusCode::kFormatError, fmt::format("{}: not valid JSON: {}", origin, e.what()));
  }
}

std::string read_text_file(const std::string& path, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block the open
  if (fd < 0) {
    const int err = errno;
    FP4MOE_CHECK(err != ENOENT, StatusCode::kNotFound, "{}: file not found", path);
    throw Error(StatusCode::kIoError, fmt::format("{}: cannot open: {}", path, std::strerror(err)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  FP4MOE_CHECK(::fstat(fd, &st) == 0, StatusCode::kIoError, "{}: fstat failed: {}", path, std::strerror(errno));
  FP4MOE_CHECK(S_ISREG(st.st_mode), StatusCode::kIoError, "{}: not a regular file", path);
  FP4MOE_CHECK(static_cast<uint64_t>(st.st_size) <= max_bytes, StatusCode::kFormatError,
               "{}: file is {} bytes, more than the {} bytes allowed for this kind of file", path,
               static_cast<uint64_t>(st.st_size), max_bytes);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    FP4MOE_CHECK(got >= 0, StatusCode::kIoError, "{}: read failed: {}", path, std::strerror(errno));
    if (got == 0) break;
    text.append(buf, static_cast<size_t>(got));
    FP4MOE_CHECK(text.size() <= max_bytes, StatusCode::kFormatError, "{}: file grew past {} bytes while reading",
                 path, max_bytes);
  }
  return text;
}

const char* json_type_name(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "object";
    case nlohmann::json::value_t::array: return "array";
    case nlohmann::json::value_t::string: return "string";
    case nlohmann::json::value_t::boolean: return "boolean";
    case nlohmann::json::value_t::number_integer: return "integer";
    case nlohmann::json::value_t::number_unsigned: return "unsigned integer";
    case nlohmann::json::value_t::number_float: return "floating-point number";
    case nlohmann::json::value_t::binary: return "binary";
    case nlohmann::json::value_t::discarded: return "discarded";
  }
  return "?";
}

std::string json_brief(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

}  // namespace detail
}  // namespace fp4moe
