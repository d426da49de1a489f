#pragma once
// One entry of a checkpoint body's table of contents (detail/body.hpp has the schema), and
// the body's limits: what a reader needs to know about a body without its archive.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "../format.hpp"
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
    /// Format version 3: the XXH3-64 of each chunk of the payload, in order (the body's chunk
    /// size; the last chunk may be shorter). Empty in older files and for other kinds.
    std::vector<std::uint64_t> chunk_hashes;

    /// The shape the tensor's elements are indexed by (Tensor::logical_shape()).
    Shape logical_shape() const { return order == Order::column_major ? reversed(shape) : shape; }
};

/// The table of contents' entry of a value held in memory: a tensor's layout, or the value.
inline EntryMeta entry_of(const std::string& name, const Value& value) {
    EntryMeta e;
    e.name = name;
    e.kind = value.kind();
    if (const Tensor* t = value.get_if<Tensor>()) {
        e.dtype = t->dtype();
        e.shape = t->shape();
        e.order = t->order();
        e.nbytes = t->nbytes();
    } else {
        e.scalar = value;
    }
    return e;
}

/// File offsets of the tensor payloads of a binary body without codecs, by entry (FORMAT.md
/// sections 3 and 4: a payload starts after a u32 pad and pad zero bytes, 64-byte aligned).
inline std::map<std::string, std::uint64_t> payload_offsets(const std::vector<EntryMeta>& toc, bool chunked) {
    std::uint64_t at = chunked ? 16 : 8;  // [chunk_bytes], entries
    for (const auto& e : toc) {
        at += 8 + e.name.size() + 4;  // name, kind
        switch (e.kind) {
            case ValueKind::tensor:
                at += 4 + 4 + 8 * e.shape.size() + 8 + 8 * e.chunk_hashes.size();
                // the storage order record the reader folded into a column-major tensor's entry
                if (e.order == Order::column_major)
                    at += 8 + order_record_name(e.name).size() + 4 + 8 + column_major_value.size();
                break;
            case ValueKind::boolean: at += 4; break;
            case ValueKind::string: at += 8 + e.scalar.get_if<std::string>()->size(); break;
            case ValueKind::bytes: at += 8 + e.scalar.get_if<Bytes>()->data.size(); break;
            case ValueKind::strings:
                at += 8;
                for (const auto& item : *e.scalar.get_if<Strings>()) at += 8 + item.size();
                break;
            case ValueKind::object: {
                const auto& o = *e.scalar.get_if<Object>();
                at += 8 + o.type.size() + 4 + 8 + o.data.size();
                break;
            }
            default: at += 8; break;
        }
    }
    if (chunked) at += 8;  // toc_check
    std::map<std::string, std::uint64_t> out;
    for (const auto& e : toc) {
        if (e.kind != ValueKind::tensor) continue;
        const std::uint64_t pad = (payload_alignment - (at + 4) % payload_alignment) % payload_alignment;
        at += 4 + pad;
        out[e.name] = header_size + at;
        at += e.nbytes;
    }
    return out;
}

}  // namespace ckpt::detail
