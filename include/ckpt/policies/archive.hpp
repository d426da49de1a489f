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

/// The Boost archive a manager writes bodies with: a type with `static constexpr ArchiveKind kind`.
/// Loading needs none: the header records the kind. Members: BinaryArchive, TextArchive,
/// XmlArchive.
template <class A>
concept ArchivePolicy = requires {
    { A::kind } -> std::convertible_to<ArchiveKind>;
};

/// Boost's binary archive, the default: the fastest, payloads as raw 64-byte-aligned blocks;
/// read back on the same platform only.
struct BinaryArchive {
    static constexpr ArchiveKind kind = ArchiveKind::binary;
};
/// Boost's text archive: portable across platforms; strings and payloads base64-encoded.
struct TextArchive {
    static constexpr ArchiveKind kind = ArchiveKind::text;
};
/// Boost's xml archive: portable, with readable names and values; payloads base64-encoded.
struct XmlArchive {
    static constexpr ArchiveKind kind = ArchiveKind::xml;
};

}  // namespace ckpt
