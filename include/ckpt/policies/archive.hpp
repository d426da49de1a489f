#pragma once
// ArchivePolicy: which Boost.Serialization archive writes the checkpoint body.
//
// An ArchivePolicy A provides `static constexpr ArchiveKind kind`. Loading needs no policy:
// the header records the kind and the reader dispatches on it.
//
// Members: BinaryArchive (the default: fastest, payloads as raw blocks, same platform only),
// TextArchive (portable; strings and payloads base64-encoded) and XmlArchive (portable, with
// readable names and values; payloads base64-encoded).
// There is no do-nothing member: a checkpoint that is not written is SavePolicy Never.

#include <concepts>

#include "../format.hpp"

namespace ckpt {

template <class A>
concept ArchivePolicy = requires {
    { A::kind } -> std::convertible_to<ArchiveKind>;
};

struct BinaryArchive {
    static constexpr ArchiveKind kind = ArchiveKind::binary;
};
struct TextArchive {
    static constexpr ArchiveKind kind = ArchiveKind::text;
};
struct XmlArchive {
    static constexpr ArchiveKind kind = ArchiveKind::xml;
};

}  // namespace ckpt
