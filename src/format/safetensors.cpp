// safetensors reader: open, map read-only, validate the whole header before any tensor is served, then
// typed reads with dtype and shape checks.
//
// Layout (https://github.com/huggingface/safetensors, README "Format"): bytes [0, 8) hold N as a
// little-endian u64; bytes [8, 8+N) hold a UTF-8 JSON object; the data section follows, and each
// tensor's data_offsets [begin, end) are relative to its start. Everything the header says is checked
// against the file before use, so a hostile or truncated file gives an Error, never a read past the
// mapping. Integer products are overflow-checked.
#include "fp4moe/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "format/safetensors_json.h"
#include "fp4moe/status.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian and is read in place; a big-endian host needs byte swaps");

namespace fp4moe {
namespace {

using nlohmann::json;

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string known_dtype_names() {
  std::string s;
  for (int i = 0; i < 256; ++i) {
    const char* name = dtype_name(static_cast<DType>(i));
    if (std::strcmp(name, "?") == 0) break;
    s += (i ? ", " : "") + std::string(name);
  }
  return s;
}

// A JSON integer that must be >= 0 (and, for shapes, fit in int64). Returns false with `why` set.
bool json_non_negative(const json& v, uint64_t limit, uint64_t* out, std::string* why) {
  if (!v.is_number_integer()) {
    *why = fmt::format("found {} {}", detail::json_type_name(v), detail::json_brief(v));
    return false;
  }
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > limit) {
      *why = fmt::format("found {}, larger than the limit {}", u, limit);
      return false;
    }
    *out = u;
    return true;
  }
  const int64_t i = v.get<int64_t>();
  if (i < 0) {
    *why = fmt::format("found negative value {}", i);
    return false;
  }
  if (static_cast<uint64_t>(i) > limit) {
    *why = fmt::format("found {}, larger than the limit {}", i, limit);
    return false;
  }
  *out = static_cast<uint64_t>(i);
  return true;
}

// Validates one header entry and fills `t`. `where` is "<file>: tensor '<name>'".
void parse_entry(const std::string& where, const json& v, uint64_t data_size, TensorInfo* t) {
  FP4MOE_CHECK(v.is_object(), StatusCode::kFormatError,
               "{}: header entry must be an object with dtype, shape and data_offsets, found {} {}", where,
               detail::json_type_name(v), detail::json_brief(v));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    FP4MOE_CHECK(v.contains(field), StatusCode::kFormatError, "{}: header entry has no '{}' field (found {})",
                 where, field, detail::json_brief(v));

  const json& dt = v.at("dtype");
  FP4MOE_CHECK(dt.is_string(), StatusCode::kFormatError, "{}: dtype must be a string, found {} {}", where,
               detail::json_type_name(dt), detail::json_brief(dt));
  FP4MOE_CHECK(dtype_from_name(dt.get_ref<const std::string&>(), &t->dtype), StatusCode::kFormatError,
               "{}: unknown or unsupported dtype '{}' (supported: {})", where, dt.get_ref<const std::string&>(),
               known_dtype_names());

  const json& shape = v.at("shape");
  FP4MOE_CHECK(shape.is_array(), StatusCode::kFormatError,
               "{}: shape must be an array of non-negative integers, found {} {}", where,
               detail::json_type_name(shape), detail::json_brief(shape));
  uint64_t numel = 1;
  const uint64_t kI64Max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  t->shape.clear();
  for (size_t i = 0; i < shape.size(); ++i) {
    uint64_t d = 0;
    std::string why;
    FP4MOE_CHECK(json_non_negative(shape[i], kI64Max, &d, &why), StatusCode::kFormatError,
                 "{}: shape {} dimension {} must be a non-negative integer, {}", where, detail::json_brief(shape), i,
                 why);
    FP4MOE_CHECK(!__builtin_mul_overflow(numel, d, &numel) && numel <= kI64Max, StatusCode::kFormatError,
                 "{}: shape {} has more elements than fit in 63 bits", where, detail::json_brief(shape));
    t->shape.push_back(static_cast<int64_t>(d));
  }

  const json& off = v.at("data_offsets");
  FP4MOE_CHECK(off.is_array() && off.size() == 2, StatusCode::kFormatError,
               "{}: data_offsets must be an array [begin, end] of two non-negative integers, found {}", where,
               detail::json_brief(off));
  uint64_t be[2];
  for (int i = 0; i < 2; ++i) {
    std::string why;
    FP4MOE_CHECK(json_non_negative(off[i], std::numeric_limits<uint64_t>::max(), &be[i], &why),
                 StatusCode::kFormatError, "{}: data_offsets {} {} must be a non-negative integer, {}", where,
                 detail::json_brief(off), i == 0 ? "begin" : "end", why);
  }
  t->begin = be[0];
  t->end = be[1];
  FP4MOE_CHECK(t->begin <= t->end, StatusCode::kFormatError,
               "{}: data_offsets [{}, {}] have begin after end (expected begin <= end)", where, t->begin, t->end);
  FP4MOE_CHECK(t->end <= data_size, StatusCode::kFormatError,
               "{}: data_offsets [{}, {}] end past the data section, which has {} bytes", where, t->begin, t->end,
               data_size);

  uint64_t bytes = 0;
  FP4MOE_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t->dtype)), &bytes),
               StatusCode::kFormatError, "{}: dtype {} x shape {} overflows 64 bits", where, dtype_name(t->dtype),
               shape_to_string(t->shape));
  FP4MOE_CHECK(bytes == t->end - t->begin, StatusCode::kFormatError,
               "{}: dtype {} x shape {} = {} bytes, but data_offsets [{}, {}] give {}", where, dtype_name(t->dtype),
               shape_to_string(t->shape), bytes, t->begin, t->end, t->end - t->begin);
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const { return shape_to_string(shape); }

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block the open
  if (fd < 0) {
    const int err = errno;
    FP4MOE_CHECK(err != ENOENT, StatusCode::kNotFound, "{}: file not found", path);
    throw Error(StatusCode::kIoError, fmt::format("{}: cannot open: {}", path, std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(StatusCode::kIoError, fmt::format("{}: fstat failed: {}", path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(StatusCode::kIoError, fmt::format("{}: not a regular file", path));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw Error(StatusCode::kFormatError,
                fmt::format("{}: file is {} bytes, too short for the 8-byte header length (truncated?)", path, size));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  FP4MOE_CHECK(map != MAP_FAILED, StatusCode::kIoError, "{}: mmap of {} bytes failed: {}", path, size,
               std::strerror(map_err));
  map_ = map;
  map_size_ = size;

  try {
    const uint8_t* base = static_cast<const uint8_t*>(map_);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(base[i]) << (8 * i);
    FP4MOE_CHECK(n <= kSafetensorsMaxHeaderBytes, StatusCode::kFormatError,
                 "{}: header length {} bytes exceeds the limit of {} bytes (file is {} bytes)", path, n,
                 kSafetensorsMaxHeaderBytes, size);
    FP4MOE_CHECK(n <= size - 8, StatusCode::kFormatError,
                 "{}: header length {} bytes, but only {} bytes follow the 8-byte length field (truncated?)", path, n,
                 size - 8);
    const char* text = reinterpret_cast<const char*>(base + 8);
    const json header = detail::parse_json_strict(text, text + n, path + ": header", 8);
    FP4MOE_CHECK(header.is_object(), StatusCode::kFormatError, "{}: header must be a JSON object, found {} {}", path,
                 detail::json_type_name(header), detail::json_brief(header));
    const uint64_t data_size = size - 8 - n;
    data_section_ = base + 8 + n;

    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        FP4MOE_CHECK(it->is_object(), StatusCode::kFormatError,
                     "{}: __metadata__ must be an object mapping strings to strings, found {} {}", path,
                     detail::json_type_name(*it), detail::json_brief(*it));
        for (auto m = it->begin(); m != it->end(); ++m) {
          FP4MOE_CHECK(m->is_string(), StatusCode::kFormatError,
                       "{}: __metadata__ value of '{}' must be a string, found {} {}", path, m.key(),
                       detail::json_type_name(*m), detail::json_brief(*m));
          metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      TensorInfo t;
      t.name = it.key();
      parse_entry(fmt::format("{}: tensor '{}'", path, t.name), *it, data_size, &t);
      tensors_.push_back(std::move(t));
    }

    // File order: by offset. Non-empty byte ranges must not overlap (gaps are allowed).
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      if (a.begin != b.begin) return a.begin < b.begin;
      if (a.end != b.end) return a.end < b.end;
      return a.name < b.name;
    });
    const TensorInfo* reach = nullptr;  // the non-empty tensor that ends furthest so far
    for (const TensorInfo& t : tensors_) {
      if (t.begin == t.end) continue;
      FP4MOE_CHECK(reach == nullptr || t.begin >= reach->end, StatusCode::kFormatError,
                   "{}: tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) overlap in the data section", path,
                   reach ? reach->name : "", reach ? reach->begin : 0, reach ? reach->end : 0, t.name, t.begin,
                   t.end);
      if (reach == nullptr || t.end > reach->end) reach = &t;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
  if (fd_ >= 0) ::close(fd_);
}

bool SafetensorsFile::has(const std::string& name) const { return index_.count(name) != 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  FP4MOE_CHECK(it != index_.end(), StatusCode::kNotFound, "{}: tensor '{}' not found ({} tensors in the file)", path_,
               name, tensors_.size());
  return tensors_[it->second];
}

const uint8_t* SafetensorsFile::data(const std::string& name) const { return data_section_ + info(name).begin; }

namespace {

void check_shape(const std::string& path, const TensorInfo& t, const std::vector<int64_t>& expect) {
  FP4MOE_CHECK(expect.empty() || t.shape == expect, StatusCode::kFormatError,
               "{}: tensor '{}': expected shape {}, found {} {}", path, t.name, shape_to_string(expect),
               dtype_name(t.dtype), t.shape_string());
}

void check_float_dtype(const std::string& path, const TensorInfo& t) {
  FP4MOE_CHECK(t.dtype == DType::kBF16 || t.dtype == DType::kF16 || t.dtype == DType::kF32,
               StatusCode::kFormatError, "{}: tensor '{}': expected dtype BF16, F16 or F32, found {} {}", path,
               t.name, dtype_name(t.dtype), t.shape_string());
}

}  // namespace

std::vector<float> SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& expect_shape) const {
  const TensorInfo& t = info(name);
  check_float_dtype(path_, t);
  check_shape(path_, t, expect_shape);
  const size_t n = static_cast<size_t>(t.numel());
  const uint8_t* p = data_section_ + t.begin;
  std::vector<float> out(n);
  if (t.dtype == DType::kF32) {
    if (n) std::memcpy(out.data(), p, n * 4);
  } else {
    const bool bf16 = t.dtype == DType::kBF16;
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = bf16 ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
    }
  }
  return out;
}

std::vector<uint16_t> SafetensorsFile::read_bf16(const std::string& name,
                                                 const std::vector<int64_t>& expect_shape) const {
  const TensorInfo& t = info(name);
  check_float_dtype(path_, t);
  check_shape(path_, t, expect_shape);
  if (t.dtype == DType::kBF16) {
    std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
    if (!out.empty()) std::memcpy(out.data(), data_section_ + t.begin, out.size() * 2);
    return out;
  }
  std::vector<float> f = read_f32(name, expect_shape);
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = f32_to_bf16_bits(f[i]);
  return out;
}

std::vector<uint8_t> SafetensorsFile::read_bytes(const std::string& name, DType dtype,
                                                 const std::vector<int64_t>& expect_shape) const {
  const TensorInfo& t = info(name);
  FP4MOE_CHECK(t.dtype == dtype, StatusCode::kFormatError, "{}: tensor '{}': expected dtype {}, found {} {}", path_,
               name, dtype_name(dtype), dtype_name(t.dtype), t.shape_string());
  check_shape(path_, t, expect_shape);
  const uint8_t* p = data_section_ + t.begin;
  return std::vector<uint8_t>(p, p + (t.end - t.begin));
}

}  // namespace fp4moe
