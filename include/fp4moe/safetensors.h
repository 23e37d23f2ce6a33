// safetensors files: a memory-mapped, fully validated reader and an atomic writer.
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data section; offsets are relative to the data section.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fp4moe/dtype.h"

namespace fp4moe {

constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;  // 100 MB, as the reference implementation

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;   // [] is a scalar (one element)
  uint64_t begin = 0, end = 0;  // byte range inside the data section
  int64_t numel() const;
  std::string shape_string() const;  // "[2048, 3072]"
};

// Reads one file. The constructor validates everything before any tensor is used: header length
// against file size and kSafetensorsMaxHeaderBytes, JSON well-formed and of the right types, known
// dtypes, dtype x shape = byte length, offsets inside the data section, no overlaps (gaps are
// allowed, as the format allows). Errors (kFormatError / kIoError / kNotFound) name the file and,
// where it applies, the tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws kNotFound naming file and tensor
  // Raw bytes of a tensor (inside the mapping; valid while this object lives).
  const uint8_t* data(const std::string& name) const;

  // Typed reads with checks: the tensor's dtype must be one of those accepted, its shape must equal
  // `expect_shape` when that is non-empty (use {} for "any"); errors name file, tensor, expected, found.
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& expect_shape = {}) const;  // BF16/F16/F32
  std::vector<uint16_t> read_bf16(const std::string& name, const std::vector<int64_t>& expect_shape = {}) const;  // BF16/F16/F32 (rounded RNE)
  std::vector<uint8_t> read_bytes(const std::string& name, DType dtype, const std::vector<int64_t>& expect_shape = {}) const;

 private:
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_section_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Builds a file in memory order and writes it atomically (temp file in the same directory, fsync,
// rename). Callers that write next to user inputs check the output path first (tools/fp4moe refuses
// an output that is one of its inputs).
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t bytes);
  void add_metadata(const std::string& key, const std::string& value);
  void write(const std::string& path) const;

 private:
  struct Entry { std::string name; DType dtype; std::vector<int64_t> shape; std::vector<uint8_t> bytes; };
  std::vector<Entry> entries_;
  std::map<std::string, size_t> names_;  // name -> position in entries_ (duplicate check)
  std::map<std::string, std::string> metadata_;
};

// Several files behind one name space: a single .safetensors file, or a directory with
// model.safetensors.index.json ("weight_map": {tensor: file}) or a single model.safetensors.
class TensorStore {
 public:
  explicit TensorStore(const std::string& path);  // file or checkpoint directory
  bool has(const std::string& name) const;
  const SafetensorsFile& file_of(const std::string& name) const;  // throws kNotFound naming the checkpoint and tensor
  std::vector<std::string> names() const;  // sorted
  const std::string& root() const { return root_; }

 private:
  std::string root_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;
};

}  // namespace fp4moe
