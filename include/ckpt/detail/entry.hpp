#pragma once
// One entry of a checkpoint body's table of contents (detail/body.hpp has the schema), and
// the body's limits: what a reader needs to know about a body without its archive.

#include <cstdint>
#include <string>
#include <string_view>

#include "../param_dict.hpp"
#include "../tensor.hpp"

namespace ckpt::detail {

inline constexpr std::uint32_t max_tensor_rank = 64;
inline constexpr std::uint32_t payload_alignment = 64;
/// Value kinds and object encodings above this are taken for damage, not for a newer writer's
/// (as format versions are: format.hpp).
inline constexpr std::uint32_t max_plausible_code = 255;

// A column-major tensor is stored with its dimensions reversed (its bytes are then those of
// the row-major transpose) and followed by a string entry "__ckpt.order.{name}" holding
// "column_major" (FORMAT.md section 3.1). Readers fold the record into the tensor's entry.
inline constexpr std::string_view order_record_prefix = "__ckpt.order.";
inline constexpr std::string_view column_major_value = "column_major";

inline std::string order_record_name(std::string_view tensor) { return std::string(order_record_prefix) += tensor; }

/// One entry of the table of contents; tensors carry their layout, other kinds their value.
struct EntryMeta {
    std::string name;
    ValueKind kind = ValueKind::int64;
    DType dtype = DType::float32;
    Shape shape;  ///< as stored: the bytes' shape read row-major (reversed for a column-major tensor)
    Order order = Order::row_major;
    std::uint64_t nbytes = 0;
    Value scalar;

    /// The shape the tensor's elements are indexed by (Tensor::logical_shape()).
    Shape logical_shape() const { return order == Order::column_major ? reversed(shape) : shape; }
};

}  // namespace ckpt::detail
