// TensorStore: one name space over a checkpoint's safetensors files. A path is either one
// .safetensors file, or a directory holding model.safetensors.index.json (Hugging Face sharded
// layout: {"metadata": {...}, "weight_map": {tensor: shard file}}) or a single model.safetensors.
// Every shard the index names is opened and validated up front, and every mapping is checked: the
// file exists and holds the tensor.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "format/safetensors_json.h"
#include "fp4moe/safetensors.h"
#include "fp4moe/status.h"

namespace fp4moe {
namespace {

bool path_exists(const std::string& p, struct stat* st) { return ::stat(p.c_str(), st) == 0; }

// Shard names are file names relative to the checkpoint directory; refuse paths that leave it.
bool safe_relative(const std::string& f) {
  if (f.empty() || f[0] == '/') return false;
  size_t start = 0;
  while (start <= f.size()) {
    size_t slash = f.find('/', start);
    if (slash == std::string::npos) slash = f.size();
    if (f.compare(start, slash - start, "..") == 0 && slash - start == 2) return false;
    start = slash + 1;
  }
  return true;
}

}  // namespace

TensorStore::TensorStore(const std::string& path) : root_(path) {
  struct stat st;
  if (!path_exists(path, &st)) {
    const int err = errno;
    FP4MOE_CHECK(err != ENOENT, StatusCode::kNotFound, "{}: checkpoint path not found", path);
    throw Error(StatusCode::kIoError, fmt::format("{}: cannot stat: {}", path, std::strerror(err)));
  }
  auto add_whole_file = [&](const std::string& file) {
    files_.push_back(std::make_unique<SafetensorsFile>(file));
    for (const TensorInfo& t : files_.back()->tensors()) where_[t.name] = files_.size() - 1;
  };
  if (S_ISREG(st.st_mode)) {
    add_whole_file(path);
    return;
  }
  FP4MOE_CHECK(S_ISDIR(st.st_mode), StatusCode::kIoError, "{}: neither a file nor a directory", path);

  const std::string index_path = path + "/model.safetensors.index.json";
  struct stat ist;
  if (!path_exists(index_path, &ist)) {
    const std::string single = path + "/model.safetensors";
    struct stat sst;
    FP4MOE_CHECK(path_exists(single, &sst), StatusCode::kNotFound,
                 "{}: checkpoint directory has neither model.safetensors.index.json nor model.safetensors", path);
    add_whole_file(single);
    return;
  }

  const std::string text = detail::read_text_file(index_path);
  const nlohmann::json index = detail::parse_json_strict(text.data(), text.data() + text.size(), index_path);
  FP4MOE_CHECK(index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
               StatusCode::kFormatError, "{}: expected a JSON object with a \"weight_map\" object, found {}",
               index_path, detail::json_brief(index));
  std::map<std::string, size_t> file_index;  // shard file name -> files_ position
  for (auto it = index.at("weight_map").begin(); it != index.at("weight_map").end(); ++it) {
    const std::string& tensor = it.key();
    FP4MOE_CHECK(it->is_string(), StatusCode::kFormatError,
                 "{}: weight_map entry for tensor '{}' must be a file name string, found {} {}", index_path, tensor,
                 detail::json_type_name(*it), detail::json_brief(*it));
    const std::string& file = it->get_ref<const std::string&>();
    FP4MOE_CHECK(safe_relative(file), StatusCode::kFormatError,
                 "{}: tensor '{}' is mapped to '{}', which is not a file name inside the checkpoint directory",
                 index_path, tensor, file);
    auto f = file_index.find(file);
    if (f == file_index.end()) {
      const std::string full = path + "/" + file;
      struct stat fst;
      FP4MOE_CHECK(path_exists(full, &fst), StatusCode::kNotFound,
                   "{}: tensor '{}' is mapped to file '{}', which does not exist ({})", index_path, tensor, file, full);
      files_.push_back(std::make_unique<SafetensorsFile>(full));
      f = file_index.emplace(file, files_.size() - 1).first;
    }
    FP4MOE_CHECK(files_[f->second]->has(tensor), StatusCode::kFormatError,
                 "{}: tensor '{}' is mapped to file '{}', but that file has no tensor of that name", index_path,
                 tensor, file);
    where_[tensor] = f->second;
  }
}

bool TensorStore::has(const std::string& name) const { return where_.count(name) != 0; }

const SafetensorsFile& TensorStore::file_of(const std::string& name) const {
  auto it = where_.find(name);
  FP4MOE_CHECK(it != where_.end(), StatusCode::kNotFound, "{}: tensor '{}' not found in the checkpoint", root_, name);
  return *files_[it->second];
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

}  // namespace fp4moe
