// TensorStore: a single file, a directory with model.safetensors, a sharded directory with an index,
// and the index's failure modes.
#include <gtest/gtest.h>

#include "fp4moe/safetensors.h"
#include "io_test_util.h"

using fp4moe::DType;
using fp4moe::SafetensorsWriter;
using fp4moe::StatusCode;
using fp4moe::TensorStore;
using fp4moe_test::expect_error;
using fp4moe_test::TempDir;

namespace {

void write_two_shards(const TempDir& dir) {
  const float a[2] = {1, 2}, b[3] = {3, 4, 5};
  SafetensorsWriter s1, s2;
  s1.add("layer.a", DType::kF32, {2}, a, sizeof(a));
  s1.add("unlisted", DType::kF32, {2}, a, sizeof(a));
  s2.add("layer.b", DType::kF32, {3}, b, sizeof(b));
  s2.add("layer.c", DType::kF32, {}, b, 4);
  s1.write(dir.file("model-00001-of-00002.safetensors"));
  s2.write(dir.file("model-00002-of-00002.safetensors"));
}

const char* kIndex = R"({
  "metadata": {"total_size": 24},
  "weight_map": {
    "layer.a": "model-00001-of-00002.safetensors",
    "layer.b": "model-00002-of-00002.safetensors",
    "layer.c": "model-00002-of-00002.safetensors"
  }
})";

}  // namespace

TEST(TensorStore, SingleFileAndSingleModelFile) {
  TempDir dir;
  const float v[2] = {1, 2};
  SafetensorsWriter w;
  w.add("t", DType::kF32, {2}, v, sizeof(v));
  w.write(dir.file("model.safetensors"));
  for (const std::string& root : {dir.file("model.safetensors"), dir.path()}) {
    TensorStore s(root);
    EXPECT_EQ(s.root(), root);
    EXPECT_TRUE(s.has("t"));
    EXPECT_EQ(s.names(), std::vector<std::string>{"t"});
    EXPECT_EQ(s.file_of("t").read_f32("t", {2}), (std::vector<float>{1, 2}));
    expect_error([&] { s.file_of("u"); }, StatusCode::kNotFound, {root, "'u'"});
  }
}

TEST(TensorStore, ShardedWithIndex) {
  TempDir dir;
  write_two_shards(dir);
  fp4moe_test::write_file(dir.file("model.safetensors.index.json"), kIndex);
  TensorStore s(dir.path());
  EXPECT_EQ(s.names(), (std::vector<std::string>{"layer.a", "layer.b", "layer.c"}));
  EXPECT_FALSE(s.has("unlisted"));  // the index is the name space
  EXPECT_EQ(s.file_of("layer.a").path(), dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(s.file_of("layer.b").read_f32("layer.b"), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(&s.file_of("layer.b"), &s.file_of("layer.c"));  // each shard opened once
}

TEST(TensorStore, IndexErrors) {
  TempDir dir;
  write_two_shards(dir);
  const std::string index = dir.file("model.safetensors.index.json");
  auto set_index = [&](const std::string& text) { fp4moe_test::write_file(index, text); };

  set_index(R"({"weight_map": {"layer.a": "model-00001-of-00002.safetensors", "layer.z": "gone.safetensors"}})");
  expect_error([&] { TensorStore s(dir.path()); }, StatusCode::kNotFound,
               {index, "'layer.z'", "gone.safetensors", "does not exist"});

  set_index(R"({"weight_map": {"layer.b": "model-00001-of-00002.safetensors"}})");
  expect_error([&] { TensorStore s(dir.path()); }, StatusCode::kFormatError,
               {index, "'layer.b'", "model-00001-of-00002.safetensors", "no tensor of that name"});

  set_index(R"({"weight_map": {"layer.a": "../model-00001-of-00002.safetensors"}})");
  expect_error([&] { TensorStore s(dir.path()); }, StatusCode::kFormatError, {index, "'layer.a'", "inside"});

  set_index(R"({"weight_map": {"layer.a": 7}})");
  expect_error([&] { TensorStore s(dir.path()); }, StatusCode::kFormatError, {index, "'layer.a'", "string"});

  set_index(R"({"metadata": {}})");
  expect_error([&] { TensorStore s(dir.path()); }, StatusCode::kFormatError, {index, "weight_map"});

  set_index(R"({"weight_map": {"layer.a": "x", "layer.a": "y"}})");
  expect_error([&] { TensorStore s(dir.path()); }, StatusCode::kFormatError, {index, "duplicate key 'layer.a'"});

  set_index("{\"weight_map\": ");
  expect_error([&] { TensorStore s(dir.path()); }, StatusCode::kFormatError, {index, "not valid JSON"});

  // A shard that is itself malformed: the error names the shard.
  set_index(kIndex);
  fp4moe_test::write_file(dir.file("model-00002-of-00002.safetensors"), "short");
  expect_error([&] { TensorStore s(dir.path()); }, StatusCode::kFormatError,
               {"model-00002-of-00002.safetensors", "too short"});
}

TEST(TensorStore, MissingPaths) {
  TempDir dir;
  expect_error([&] { TensorStore s(dir.path()); }, StatusCode::kNotFound,
               {dir.path(), "model.safetensors.index.json", "model.safetensors"});
  expect_error([&] { TensorStore s(dir.file("nothing")); }, StatusCode::kNotFound, {dir.file("nothing")});
}
