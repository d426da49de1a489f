#pragma once
// One entry of a checkpoint body's table of contents (detail/body.hpp has the schema), and
// the body's limits: what a reader needs to know about a body without its archive.

#include <cstdint>
#include <string>

#include "../param_dict.hpp"
#include "../tensor.hpp"

namespace ckpt::detail {

inline constexpr std::uint32_t max_tensor_rank = 64;
inline constexpr std::uint32_t payload_alignment = 64;

/// One entry of the table of contents; tensors carry their layout, other kinds their value.
struct EntryMeta {
    std::string name;
    ValueKind kind = ValueKind::int64;
    DType dtype = DType::float32;
    Shape shape;
    std::uint64_t nbytes = 0;
    Value scalar;
};

}  // namespace ckpt::detail
