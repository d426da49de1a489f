#pragma once
// Zip containers through libzip, for the formats that are zips (npz, PyTorch files): owning
// handles, the checks of a member's directory entry that come before reading it (encryption,
// method, sizes within what deflate can expand), and a reader that never goes past the size
// the directory gives. Errors are FormatErrors naming the file and the member.

#include <zip.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "../error.hpp"
#include "posix_io.hpp"

namespace ckpt::detail {

/// A malformed zip-based file: "{format} file '{path}' is malformed: {why}".
[[noreturn]] inline void zip_format_fail(std::string_view format, const std::string& path, const std::string& why) {
    throw FormatError(std::string(format) + " file '" + path + "' is malformed: " + why, path);
}

struct ZipArchive {
    zip_t* za = nullptr;
    ~ZipArchive() {
        if (za) zip_discard(za);
    }
};

struct ZipFile {
    zip_file_t* zf = nullptr;
    ~ZipFile() {
        if (zf) zip_fclose(zf);
    }
};

inline std::string zip_error_text(int code) {
    zip_error_t e;
    zip_error_init_with_code(&e, code);
    std::string text = zip_error_strerror(&e);
    zip_error_fini(&e);
    return text;
}

/// Deflate expands at most about 1032:1; a member claiming more is damaged.
inline constexpr std::uint64_t max_deflate_ratio = 1032;

/// Refuses a member whose directory entry the readers cannot trust: encrypted, compressed
/// other than stored or deflated, or claiming more bytes than the file can hold.
inline void check_member_entry(const zip_stat_t& st, std::uint64_t file_bytes, std::string_view format,
                               const std::string& path, const std::string& member) {
    auto fail = [&](const std::string& why) { zip_format_fail(format, path, "member '" + member + "' " + why); };
    if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE) fail("is encrypted");
    if (!(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE) || !(st.valid & ZIP_STAT_COMP_METHOD))
        fail("has no size in the zip directory");
    if (st.comp_method != ZIP_CM_STORE && st.comp_method != ZIP_CM_DEFLATE)
        fail("uses compression method " + std::to_string(st.comp_method) + " (stored and deflated are read)");
    if (st.comp_size > file_bytes || (st.comp_method == ZIP_CM_STORE ? st.size != st.comp_size
                                                                     : st.size > st.comp_size * max_deflate_ratio + 1024))
        fail("claims " + std::to_string(st.size) + " bytes from " + std::to_string(st.comp_size) + " stored, in a file of " +
             std::to_string(file_bytes));
}

/// Reads one member in order, never past the size its directory entry gives. Errors are
/// FormatErrors of the `format` ("npz", "PyTorch") naming the file and the member.
class MemberReader {
public:
    MemberReader(zip_t* za, zip_uint64_t index, std::uint64_t size, std::string path, std::string member,
                 std::string_view format = "npz")
        : file_{zip_fopen_index(za, index, 0)}, remaining_(size), path_(std::move(path)), member_(std::move(member)),
          format_(format) {
        if (!file_.zf) fail("member '" + member_ + "' cannot be opened: " + zip_strerror(za));
    }
    std::uint64_t remaining() const { return remaining_; }

    void read(std::byte* dst, std::uint64_t n) {
        if (n > remaining_)
            fail("member '" + member_ + "' has " + std::to_string(remaining_) + " bytes left where " +
                 std::to_string(n) + " are needed");
        while (n > 0) {
            const zip_int64_t r = zip_fread(file_.zf, dst, std::min<std::uint64_t>(n, std::uint64_t{1} << 30));
            if (r < 0) fail("member '" + member_ + "': " + zip_file_strerror(file_.zf));
            if (r == 0) fail("member '" + member_ + "' ends " + std::to_string(remaining_) + " bytes early");
            dst += r;
            n -= static_cast<std::uint64_t>(r);
            remaining_ -= static_cast<std::uint64_t>(r);
        }
    }

    /// `n` bytes in a string that grows with the bytes libzip delivers rather than with the
    /// claim: a deflated member's size may be up to max_deflate_ratio times what it stores,
    /// and a damaged one claims that much without holding it.
    std::string read_growing(std::uint64_t n) {
        std::string out;
        while (out.size() < n) {
            const std::size_t at = out.size();
            const auto chunk = static_cast<std::size_t>(std::min<std::uint64_t>(n - at, std::uint64_t{1} << 16));
            if (at + chunk > out.capacity())  // doubling, but never past n
                out.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n, std::max(2 * out.capacity(), at + chunk))));
            out.resize(at + chunk);
            read(reinterpret_cast<std::byte*>(out.data() + at), chunk);
        }
        return out;
    }

    /// After the last byte: reading on is where libzip checks the CRC.
    void finish() {
        std::byte extra{};
        if (zip_fread(file_.zf, &extra, 1) != 0)
            fail("member '" + member_ + "' fails its CRC check or is longer than its directory entry: " +
                 zip_file_strerror(file_.zf));
    }

private:
    [[noreturn]] void fail(const std::string& why) const { zip_format_fail(format_, path_, why); }

    ZipFile file_;
    std::uint64_t remaining_;
    std::string path_, member_;
    std::string_view format_;
};

}  // namespace ckpt::detail
