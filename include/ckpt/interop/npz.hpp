#pragma once
// NumPy's npz files: save_npz, load_npz and npz_contents. Link ckpt::interop (libzip).
//
// An npz is a zip of "{name}.npy" members, stored or deflated (np.savez,
// np.savez_compressed). Scalars and strings become 0-d arrays ('<i8', '<f8', '|b1', '<U{n}'),
// marked by the member comment "ckpt:scalar" so that they come back as scalars rather than 0-d
// tensors; NumPy does not see the comment. A column-major tensor is written as it lies, with
// 'fortran_order': True and its logical shape, and a Fortran-ordered array is read as a
// column-major tensor: no element moves either way. Reading takes stored and deflated
// members, and either byte order.

#include <zip.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../detail/atomic_file.hpp"
#include "../detail/posix_io.hpp"
#include "../detail/zip.hpp"
#include "../path.hpp"
#include "../policies/naming.hpp"
#include "common.hpp"

namespace ckpt {

namespace detail {

// ---------------------------------------------------------------------------------------------
// npy: one array. "\x93NUMPY", major, minor, header length (u16 in 1.0, u32 in 2.0 and 3.0),
// then a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and a newline so that the data starts 64-byte aligned.

inline constexpr std::string_view npy_magic = "\x93NUMPY";
inline constexpr std::string_view npz_scalar_comment = "ckpt:scalar";

inline std::string_view npy_descr(DType d) {
    switch (d) {
        case DType::float32: return "<f4";
        case DType::float64: return "<f8";
        case DType::float16: return "<f2";
        case DType::int32: return "<i4";
        case DType::int64: return "<i8";
        case DType::uint8: return "|u1";
        case DType::boolean: return "|b1";
        case DType::int8: return "|i1";
        case DType::int16: return "<i2";
        case DType::uint16: return "<u2";
        case DType::uint32: return "<u4";
        case DType::uint64: return "<u8";
        case DType::complex64: return "<c8";
        case DType::complex128: return "<c16";
        case DType::bfloat16:  // NumPy has no such dtype
        case DType::float8_e4m3fn:
        case DType::float8_e5m2: return "";
    }
    return "";
}

/// What an npy header describes: a tensor dtype, or a string of `chars` characters
/// ('U': 4-byte code points, 'S': bytes).
struct NpyType {
    std::optional<DType> dtype;
    char string_kind = 0;
    std::size_t chars = 0;
    bool big_endian = false;
    std::size_t itemsize() const { return dtype ? ckpt::itemsize(*dtype) : string_kind == 'U' ? 4 * chars : chars; }
};

/// `shape` is the array's (logical) shape; `fortran`: its bytes are in Fortran (column-major) order.
inline std::string npy_header(std::string_view descr, const Shape& shape, bool fortran = false) {
    std::string dims;
    for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
    if (shape.size() == 1) dims += ",";
    std::string dict = "{'descr': '" + std::string(descr) + "', 'fortran_order': " + (fortran ? "True" : "False") +
                       ", 'shape': (" + dims + "), }";
    const bool v2 = dict.size() + 11 > 65535;
    const std::size_t prelude = v2 ? 12 : 10;
    dict.append((64 - (prelude + dict.size() + 1) % 64) % 64, ' ');
    dict += '\n';
    std::string out(npy_magic);
    out += static_cast<char>(v2 ? 2 : 1);
    out += '\0';
    std::array<std::byte, 4> len{};
    put_le<std::uint32_t>(len.data(), static_cast<std::uint32_t>(dict.size()));
    out.append(reinterpret_cast<const char*>(len.data()), v2 ? 4 : 2);
    return out + dict;
}

[[noreturn]] inline void npz_fail(const std::string& path, const std::string& why) { zip_format_fail("npz", path, why); }

/// A cursor over the header's dict literal, with the member's name for errors.
class NpyHeaderParser {
public:
    NpyHeaderParser(std::string_view text, std::string path, std::string member)
        : s_(text), path_(std::move(path)), member_(std::move(member)) {}

    [[noreturn]] void fail(const std::string& why) const {
        npz_fail(path_, "member '" + member_ + "' has a bad npy header: " + why);
    }

    void skip_space() {
        while (!s_.empty() && (s_.front() == ' ' || s_.front() == '\t' || s_.front() == '\n' || s_.front() == '\r'))
            s_.remove_prefix(1);
    }
    bool eat(char c) {
        skip_space();
        if (s_.empty() || s_.front() != c) return false;
        s_.remove_prefix(1);
        return true;
    }
    void expect(char c) {
        if (!eat(c)) fail(std::string("expected '") + c + "' at '" + std::string(s_.substr(0, 20)) + "'");
    }
    std::string quoted() {
        skip_space();
        if (s_.empty() || (s_.front() != '\'' && s_.front() != '"')) fail("expected a quoted string");
        const char q = s_.front();
        const auto close = s_.find(q, 1);
        if (close == std::string_view::npos) fail("a string is not terminated");
        std::string out(s_.substr(1, close - 1));
        s_.remove_prefix(close + 1);
        return out;
    }
    bool boolean() {
        skip_space();
        for (auto [word, value] : {std::pair{"True", true}, std::pair{"False", false}})
            if (s_.starts_with(word)) {
                s_.remove_prefix(std::strlen(word));
                return value;
            }
        fail("fortran_order is neither True nor False");
    }
    Shape tuple() {
        expect('(');
        Shape shape;
        while (!eat(')')) {
            skip_space();
            std::size_t n = 0;
            while (n < s_.size() && s_[n] >= '0' && s_[n] <= '9') ++n;
            const auto v = parse_count(s_.substr(0, n));
            if (!v) fail("the shape has an entry that is not a count");
            shape.push_back(*v);
            s_.remove_prefix(n);
            eat('L');  // Python 2 longs
            if (shape.size() > max_tensor_rank) fail("the shape has more than " + std::to_string(max_tensor_rank) + " dimensions");
            if (!eat(',')) {
                expect(')');
                break;
            }
        }
        return shape;
    }
    bool at_end() {
        skip_space();
        return s_.empty();
    }

private:
    std::string_view s_;
    std::string path_, member_;
};

inline NpyType parse_npy_descr(const std::string& descr, const NpyHeaderParser& p) {
    if (descr.size() < 2) p.fail("unknown descr '" + descr + "'");
    NpyType t;
    const char order = descr[0];
    if (order != '<' && order != '>' && order != '|' && order != '=') p.fail("unknown descr '" + descr + "'");
    t.big_endian = order == '>' && std::endian::native == std::endian::little;
    const std::string code = descr.substr(1);
    if (code[0] == 'U' || code[0] == 'S') {
        const auto n = parse_count(std::string_view(code).substr(1));
        if (!n) p.fail("unknown descr '" + descr + "'");
        t.string_kind = code[0];
        t.chars = static_cast<std::size_t>(*n);
        return t;
    }
    for (int c = 0; c < dtype_count; ++c)
        if (const auto known = npy_descr(static_cast<DType>(c)); !known.empty() && known.substr(1) == code)
            t.dtype = static_cast<DType>(c);
    if (!t.dtype)
        p.fail("dtype '" + descr + "' is not one ckpt holds (b1, i1, i2, i4, i8, u1, u2, u4, u8, f2, f4, f8, c8, c16, "
               "or a string)");
    return t;
}

/// UTF-8 → code points, refusing malformed sequences.
inline std::vector<char32_t> utf8_to_utf32(std::string_view s, const std::string& what) {
    std::vector<char32_t> out;
    for (std::size_t i = 0; i < s.size();) {
        const auto b = static_cast<unsigned char>(s[i]);
        const std::size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > s.size()) throw ConfigError(what + " is not valid UTF-8");
        char32_t c = len == 1 ? b : b & (0x7f >> len);
        for (std::size_t k = 1; k < len; ++k) {
            const auto cont = static_cast<unsigned char>(s[i + k]);
            if ((cont >> 6) != 2) throw ConfigError(what + " is not valid UTF-8");
            c = (c << 6) | (cont & 0x3f);
        }
        out.push_back(c);
        i += len;
    }
    return out;
}

/// Code points → UTF-8; false on a value that is no code point.
inline bool append_utf8(std::string& out, char32_t c) {
    if (c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return false;
    if (c < 0x80) {
        out += static_cast<char>(c);
    } else if (c < 0x800) {
        out += static_cast<char>(0xc0 | (c >> 6));
        out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
        out += static_cast<char>(0xe0 | (c >> 12));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
        out += static_cast<char>(0xf0 | (c >> 18));
        out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (c & 0x3f));
    }
    return true;
}

/// Throws on an entry name that would make an unsafe or unreadable npz member "{name}.npy": a
/// NUL (which ends the name), an absolute path or a "." or ".." component (which unzip and
/// np.load's callers would put outside the folder they extract to), bytes that are not UTF-8.
inline void check_npz_member_name(const std::string& name, const std::string& path) {
    auto refuse = [&](const std::string& why) {
        throw ConfigError("cannot save '" + path + "': the entry name '" + name + "' would be the zip member '" + name +
                          ".npy', which " + why + "; rename it (ckpt export --rename FROM=TO)");
    };
    if (name.find('\0') != std::string::npos) refuse("a NUL byte would cut short");
    if (!name.empty() && (name.front() == '/' || name.front() == '\\'))
        refuse("is an absolute path, which an unzip writes outside the folder it extracts to");
    for (std::size_t at = 0; at <= name.size();) {
        const auto end = std::min(name.find_first_of("/\\", at), name.size());
        const std::string_view part = std::string_view(name).substr(at, end - at);
        if (part == ".." || part == ".")
            refuse("has a '" + std::string(part) + "' component, which an unzip follows outside the folder it extracts to");
        at = end + 1;
    }
    try {
        utf8_to_utf32(name, "");
    } catch (const ConfigError&) {
        refuse("is not valid UTF-8, as a zip member's name must be for NumPy to read it");
    }
}

}  // namespace detail

/// Writes `dict` as an npz file: one "{name}.npy" per entry, stored (np.savez) or deflated
/// (np.savez_compressed).
inline void save_npz(const ParamDict& state, const PathArg& file, bool compressed = false) {
    const std::string path = file.string();
    const ParamDict dict = detail::exportable(state, path, "npz");
    for (const auto& [name, value] : dict) {
        detail::check_npz_member_name(name, path);
        if (const Tensor* t = value.get_if<Tensor>()) detail::check_bool_bytes(name, *t, path);
    }
    detail::AtomicFile out(file);
    if (dict.empty()) {  // libzip writes no file for an empty archive: the bare end record
        std::array<std::byte, 22> end{};
        detail::put_le<std::uint32_t>(end.data(), 0x06054b50u);
        detail::write_all(out.fd(), end.data(), end.size(), path);
        out.commit();
        return;
    }
    int err = 0;
    detail::ZipArchive zip{zip_open(out.temp_path().c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err)};
    if (!zip.za) throw IoError("cannot save '" + path + "': " + detail::zip_error_text(err), path);
    auto fail = [&](const std::string& what) -> void {
        throw IoError("cannot save '" + path + "': " + what + ": " + zip_strerror(zip.za), path);
    };
    // libzip reads the members at zip_close(): what they point to must live until then.
    std::vector<std::string> headers;
    std::vector<std::u32string> texts;
    headers.reserve(dict.size());
    texts.reserve(dict.size());
    for (const auto& [name, value] : dict) {
        const void* data = nullptr;  // the payload, when it is not in the header's string
        std::size_t nbytes = 0;
        // An int64, double or bool: its bytes follow the header in the same string.
        auto header_with = [&](DType dtype, const auto& scalar) {
            headers.push_back(detail::npy_header(detail::npy_descr(dtype), {}));
            headers.back().append(reinterpret_cast<const char*>(&scalar), sizeof scalar);
        };
        if (const Tensor* t = value.get_if<Tensor>()) {
            if (detail::npy_descr(t->dtype()).empty())
                throw ConfigError("cannot save '" + path + "': tensor '" + name + "' is " +
                                  std::string(dtype_name(t->dtype())) +
                                  ", which NumPy, and so npz, has no dtype for; save it as safetensors or a checkpoint");
            headers.push_back(detail::npy_header(detail::npy_descr(t->dtype()), t->logical_shape(),
                                                 t->order() == Order::column_major));
            data = t->data();
            nbytes = t->nbytes();
        } else if (const auto* s = value.get_if<std::string>()) {
            const auto points = detail::utf8_to_utf32(*s, "cannot save '" + path + "': string '" + name + "'");
            texts.emplace_back(points.begin(), points.end());
            if (texts.back().empty()) texts.back().push_back(U'\0');  // NumPy's '' is one NUL code point
            headers.push_back(detail::npy_header("<U" + std::to_string(texts.back().size()), {}));
            data = texts.back().data();
            nbytes = texts.back().size() * 4;
        } else if (const auto* i = value.get_if<std::int64_t>()) {
            header_with(DType::int64, *i);
        } else if (const auto* d = value.get_if<double>()) {
            header_with(DType::float64, *d);
        } else {
            header_with(DType::boolean, *value.get_if<bool>());
        }
        zip_buffer_fragment_t fragments[2] = {{reinterpret_cast<zip_uint8_t*>(headers.back().data()), headers.back().size()},
                                              {static_cast<zip_uint8_t*>(const_cast<void*>(data)), nbytes}};
        zip_source_t* src = zip_source_buffer_fragment(zip.za, fragments, nbytes == 0 ? 1 : 2, 0);
        if (!src) fail("member '" + name + ".npy'");
        // as NumPy (Python's zipfile) writes them: flagged UTF-8 only when beyond ASCII (libzip
        // refuses a UTF-8 name holding a control character, as a guess of CP437)
        const bool ascii = std::all_of(name.begin(), name.end(), [](char c) { return (c & 0x80) == 0; });
        const zip_int64_t index =
            zip_file_add(zip.za, (name + ".npy").c_str(), src, ascii ? ZIP_FL_ENC_CP437 : ZIP_FL_ENC_UTF_8);
        if (index < 0) {
            zip_source_free(src);
            fail("member '" + name + ".npy'");
        }
        const auto at = static_cast<zip_uint64_t>(index);
        if (zip_set_file_compression(zip.za, at, compressed ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0) != 0)
            fail("member '" + name + ".npy'");
        if (!value.is_tensor() &&
            zip_file_set_comment(zip.za, at, detail::npz_scalar_comment.data(),
                                 static_cast<zip_uint16_t>(detail::npz_scalar_comment.size()), 0) != 0)
            fail("member '" + name + ".npy'");
    }
    if (zip_close(zip.za) != 0) fail("writing the archive");
    zip.za = nullptr;
    out.reopen_replaced();  // libzip wrote a new file in place of the temporary
    out.commit();
}

namespace detail {
/// Reads the npz file at `path`: every member's npy header and, with `payloads`, its data into
/// `dict`. Without payloads (what `ckpt show` lists), tensors are described into `entries`,
/// their bytes (and their members' CRCs) not read; values, single strings and the scalars ckpt
/// marks, are read either way.
inline void read_npz(const std::string& path, const InteropLoadOptions& opts, bool payloads, ParamDict& dict,
                     std::vector<EntryMeta>& entries) {
    std::uint64_t file_bytes = 0;
    {
        auto fd = open_for_read(path, "npz file");  // an IoError naming the file when it cannot be read
        file_bytes = file_size(fd.get(), path);
    }
    int err = 0;
    ZipArchive zip{zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err)};
    if (!zip.za) npz_fail(path, "it is not a readable zip archive: " + zip_error_text(err));
    DecodeBudget budget("npz file '" + path + "'", path, opts.max_decoded_bytes, file_bytes, interop_budget_option);
    std::unordered_set<std::string> names;
    auto add = [&](const std::string& name, Value v) {
        if (payloads) {
            dict.set(name, std::move(v));
            return;
        }
        EntryMeta& e = entries.emplace_back();
        e.name = name;
        e.kind = v.kind();
        e.scalar = std::move(v);
    };
    const zip_int64_t count = zip_get_num_entries(zip.za, 0);
    for (zip_int64_t k = 0; k < count; ++k) {
        const auto i = static_cast<zip_uint64_t>(k);
        zip_stat_t st;
        zip_stat_init(&st);
        // the name's bytes as stored: NumPy's names are ASCII or flagged UTF-8, and libzip's guess
        // would take an ASCII control character for CP437 (ESC for an arrow)
        if (zip_stat_index(zip.za, i, ZIP_FL_ENC_RAW, &st) != 0)
            npz_fail(path, "member " + std::to_string(k) + ": " + zip_strerror(zip.za));
        const std::string member = st.name ? st.name : "";
        if (!member.empty() && member.back() == '/') continue;  // a directory
        if (member.size() <= 4 || member.substr(member.size() - 4) != ".npy")
            npz_fail(path, "member '" + member + "' is not a .npy array");
        const std::string name = member.substr(0, member.size() - 4);
        auto fail = [&](const std::string& why) { npz_fail(path, "member '" + member + "' " + why); };
        check_member_entry(st, file_bytes, "npz", path, member);
        if (!names.insert(name).second) npz_fail(path, "'" + name + "' appears twice");
        auto take = [&](std::uint64_t n) {
            budget.take(n, [&] { return "member '" + member + "' unpacks to " + std::to_string(st.size) + " bytes"; });
        };

        MemberReader in(zip.za, i, st.size, path, member);
        std::array<std::byte, 12> prelude{};
        in.read(prelude.data(), 10);
        if (std::memcmp(prelude.data(), npy_magic.data(), npy_magic.size()) != 0)
            fail("is not an npy array (bad magic bytes)");
        const auto major = static_cast<unsigned>(prelude[6]);
        if (major < 1 || major > 3) fail("has npy format version " + std::to_string(major) + " (1 to 3 are read)");
        std::uint64_t header_len = get_le<std::uint16_t>(prelude.data() + 8);
        if (major > 1) {
            in.read(prelude.data() + 10, 2);
            header_len = get_le<std::uint32_t>(prelude.data() + 8);
        }
        if (header_len > in.remaining())
            fail("has an npy header of " + std::to_string(header_len) + " bytes, more than the member's " +
                 std::to_string(in.remaining()) + " left");
        take(header_len);
        const std::string header = in.read_growing(header_len);

        NpyHeaderParser parser(header, path, member);
        std::optional<NpyType> type;
        std::optional<bool> fortran;
        std::optional<Shape> shape;
        parser.expect('{');
        while (!parser.eat('}')) {
            const std::string key = parser.quoted();
            parser.expect(':');
            if (key == "descr") type = parse_npy_descr(parser.quoted(), parser);
            else if (key == "fortran_order") fortran = parser.boolean();
            else if (key == "shape") shape = parser.tuple();
            else parser.fail("unknown key '" + key + "'");
            if (!parser.eat(',')) {
                parser.expect('}');
                break;
            }
        }
        if (!parser.at_end()) parser.fail("text after the dict");
        if (!type || !fortran || !shape) parser.fail("descr, fortran_order or shape is missing");

        std::size_t numel = 0;
        try {
            numel = checked_numel(*shape, static_cast<std::size_t>(in.remaining()));
        } catch (const FormatError&) {
            fail("has an impossible shape " + shape_string(*shape));
        }
        const std::size_t width = type->itemsize();
        const bool overflow = width != 0 && numel > std::numeric_limits<std::uint64_t>::max() / width;
        const std::uint64_t nbytes = numel * width;
        if (overflow || nbytes != in.remaining())
            fail("holds " + std::to_string(in.remaining()) + " data bytes, its header describes " +
                 (overflow ? "more" : std::to_string(nbytes)));
        const bool scalar_marked = [&] {
            zip_uint32_t len = 0;
            const char* c = zip_file_get_comment(zip.za, i, &len, 0);
            return c && std::string_view(c, len) == npz_scalar_comment;
        }();

        if (type->string_kind) {
            if (!shape->empty()) fail("is an array of strings; only single strings are read");
            take(nbytes);
            const std::string raw = in.read_growing(nbytes);
            in.finish();
            std::string text;
            if (type->string_kind == 'S') {
                text = raw;
            } else {
                for (std::size_t c = 0; c < type->chars; ++c) {
                    auto code = get_le<std::uint32_t>(reinterpret_cast<const std::byte*>(raw.data()) + 4 * c);
                    if (type->big_endian) code = __builtin_bswap32(code);
                    if (!append_utf8(text, static_cast<char32_t>(code)))
                        fail("holds a string with the invalid code point " + std::to_string(code));
                }
            }
            text.erase(text.find_last_not_of('\0') + 1);  // NumPy pads with NULs (npos + 1: all of it)
            add(name, std::move(text));
            continue;
        }
        const DType dtype = *type->dtype;
        const bool value = scalar_marked && shape->empty() &&
                           (dtype == DType::int64 || dtype == DType::float64 || dtype == DType::boolean);
        const Order order = *fortran ? Order::column_major : Order::row_major;
        if (!payloads && !value) {
            EntryMeta& e = entries.emplace_back();
            e.name = name;
            e.kind = ValueKind::tensor;
            e.dtype = dtype;
            e.order = order;
            e.shape = order == Order::column_major ? reversed(*shape) : *shape;  // as stored, like a tensor's shape()
            e.nbytes = nbytes;
            continue;
        }
        take(nbytes);
        // a Fortran-ordered array is a column-major tensor: its bytes as they are
        Tensor t = Tensor::uninitialized(dtype, *shape, order);
        in.read(t.data(), t.nbytes());
        in.finish();
        if (type->big_endian) swap_bytes(t.data(), t.nbytes(), number_size(dtype));  // a complex's parts apart
        if (dtype == DType::boolean)
            for (std::size_t b = 0; b < t.nbytes(); ++b)
                if (static_cast<unsigned>(t.data()[b]) > 1) fail("holds a bool that is neither 0 nor 1");
        if (!value) add(name, std::move(t));
        else if (dtype == DType::int64) add(name, t.values<std::int64_t>()[0]);
        else if (dtype == DType::float64) add(name, t.values<double>()[0]);
        else add(name, t.values<bool>()[0]);
    }
}
}  // namespace detail

/// Reads an npz file (np.savez or np.savez_compressed): one entry per "{name}.npy" member,
/// in the archive's order.
inline ParamDict load_npz(const PathArg& file, const InteropLoadOptions& opts = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] {
        ParamDict dict;
        std::vector<detail::EntryMeta> unused;
        detail::read_npz(path, opts, true, dict, unused);
        return dict;
    });
}

/// What load_npz would return, in its order, as a table of contents: each tensor's dtype,
/// shape and storage order from its npy header, its bytes not read (nor their CRC checked);
/// values and strings with their value. Reads the zip directory and each member's header.
inline std::vector<detail::EntryMeta> npz_contents(const PathArg& file, const InteropLoadOptions& opts = {}) {
    const std::string path = file.string();
    return detail::reading_foreign(path, [&] {
        ParamDict unused;
        std::vector<detail::EntryMeta> entries;
        detail::read_npz(path, opts, false, unused, entries);
        return entries;
    });
}

}  // namespace ckpt
