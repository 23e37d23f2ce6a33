// Strict JSON parsing for the files we read from checkpoints (safetensors headers, the shard index,
// hf_quant_config.json): nesting depth is bounded (no deep-recursion blow-up on hostile input) and
// duplicate keys in any object are errors (nlohmann::json would silently keep the last one).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace fp4moe {
namespace detail {

// Parses [begin, end) as JSON. Throws Error(kFormatError) "<origin>: ..." on malformed text, a nesting
// deeper than max_depth, or a key repeated in one object.
nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& origin,
                                 int max_depth = 16);

// Reads a whole (small) regular file; kNotFound / kIoError / kFormatError (larger than max_bytes) name the path.
std::string read_text_file(const std::string& path, uint64_t max_bytes = 64ull << 20);

// A JSON value's type in words ("string", "unsigned integer", ...), for messages.
const char* json_type_name(const nlohmann::json& v);

// Shortens a value for a message (dump, cut to ~60 characters).
std::string json_brief(const nlohmann::json& v);

}  // namespace detail
}  // namespace fp4moe
