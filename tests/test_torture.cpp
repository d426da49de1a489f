// Torture: a corpus of damaged checkpoints, each rejected with the error it deserves and
// without an allocation beyond the file's size.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string_view>

#include "alloc_tracker.hpp"
#include "support.hpp"

namespace {

namespace fs = boost::filesystem;
using test::TempDir;

/// tmpfs when there is one: these tests write and fsync thousands of files, and nothing they
/// check depends on the file system.
fs::path scratch_base() {
    boost::system::error_code ec;
    return fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
}

void patch(const fs::path& p, std::size_t offset, const char* data, std::size_t n) {
    const int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const bool ok = ::pwrite(fd, data, n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n);
    ::close(fd);
    REQUIRE(ok);
}

// ----------------------------------------------------------------------------------------
// Where things are in a checkpoint file, derived from the format rather than hard-coded.

using Range = std::pair<std::size_t, std::size_t>;  // [begin, end) in the file

void layout_check(bool ok, const char* what) {
    if (!ok) throw std::runtime_error(std::string("walking a checkpoint's layout: ") + what);
}

/// The header's regions: magic, then each field of FileHeader, then the header check. Each
/// field is found by encoding a header with only that field changed; the bytes that change
/// every time are the header check.
std::vector<Range> header_regions() {
    const auto base = ckpt::encode_header({});
    std::vector<std::vector<bool>> changed;
    auto vary = [&](auto set) {
        ckpt::FileHeader h;
        set(h);
        const auto b = ckpt::encode_header(h);
        std::vector<bool> c(ckpt::header_size);
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = b[i] != base[i];
        changed.push_back(c);
    };
    vary([](ckpt::FileHeader& h) { h.version = ~0u; });
    vary([](ckpt::FileHeader& h) { h.archive = static_cast<ckpt::ArchiveKind>(~0u); });
    vary([](ckpt::FileHeader& h) { h.body_length = ~0ull; });
    vary([](ckpt::FileHeader& h) { h.body_hash = ~0ull; });
    vary([](ckpt::FileHeader& h) { h.epoch = -1; });
    vary([](ckpt::FileHeader& h) { h.step = -1; });
    vary([](ckpt::FileHeader& h) { h.save_time_ns = -1; });
    std::vector<bool> check(ckpt::header_size, true);
    for (const auto& c : changed)
        for (std::size_t i = 0; i < check.size(); ++i) check[i] = check[i] && c[i];
    auto span_of = [](const std::vector<bool>& bytes) {
        const auto first = std::find(bytes.begin(), bytes.end(), true);
        const auto last = std::find(bytes.rbegin(), bytes.rend(), true).base();
        return Range(static_cast<std::size_t>(first - bytes.begin()), static_cast<std::size_t>(last - bytes.begin()));
    };
    std::vector<Range> out{{0, ckpt::file_magic.size()}};
    for (auto c : changed) {
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = c[i] && !check[i];
        out.push_back(span_of(c));
    }
    out.push_back(span_of(check));
    std::sort(out.begin(), out.end());
    return out;
}

enum class FieldKind { count, name_length, kind, dtype, rank, dim, nbytes, scalar, string_length, pad };

struct Field {
    FieldKind kind;
    Range at;
    std::uint64_t value = 0;
    bool empty_tensor_dim = false;  // a dimension of a tensor with another dimension of 0
};

/// The body's table of contents and payloads, walked by the schema of detail/body.hpp.
struct Layout {
    std::vector<Field> fields;  // in file order
    std::size_t toc_end = 0;
    std::vector<Range> payloads;
    std::size_t end = 0;  // where the walk stopped
};

/// Binary bodies: fixed-width little-endian fields, raw bytes.
struct BinaryCursor {
    const std::vector<char>& b;
    std::size_t at = ckpt::header_size;
    Field number(FieldKind k, std::size_t width, const char*) {
        layout_check(at + width <= b.size(), "a field past the end");
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < width; ++i) v |= std::uint64_t(static_cast<unsigned char>(b[at + i])) << (8 * i);
        Field f{k, {at, at + width}, v};
        at += width;
        return f;
    }
    Range bytes(std::uint64_t n, const char*) {
        const Range r{at, at + n};
        at += n;
        return r;
    }
    void string(FieldKind k, const char* tag, Layout& l) {
        const Field n = number(k, 8, tag);
        l.fields.push_back(n);
        bytes(n.value, tag);
    }
    Range payload(std::uint64_t n, Layout& l) {
        const Field pad = number(FieldKind::pad, 4, "pad");
        l.fields.push_back(pad);
        at += pad.value;
        return bytes(n, "data");
    }
};

/// Text bodies: whitespace-separated tokens after the archive's signature and version;
/// bytes as base64, broken into lines.
struct TextCursor {
    const std::vector<char>& b;
    std::size_t at = ckpt::header_size;
    explicit TextCursor(const std::vector<char>& bytes) : b(bytes) {
        for (int i = 0; i < 3; ++i) token();  // "22 serialization::archive <library version>"
    }
    Range token() {
        while (at < b.size() && std::isspace(static_cast<unsigned char>(b[at]))) ++at;
        const std::size_t begin = at;
        while (at < b.size() && !std::isspace(static_cast<unsigned char>(b[at]))) ++at;
        layout_check(at > begin, "a token past the end");
        return {begin, at};
    }
    Field number(FieldKind k, std::size_t, const char*) {
        const Range r = token();
        std::uint64_t v = 0;
        std::from_chars(b.data() + r.first, b.data() + r.second, v);  // doubles read as 0: unused
        return {k, r, v};
    }
    Range bytes(std::uint64_t n, const char*) {
        if (n == 0) return {at, at};
        std::size_t chars = (n + 2) / 3 * 4;
        Range all{SIZE_MAX, 0};
        while (chars > 0) {
            const Range r = token();
            layout_check(r.second - r.first <= chars, "base64 longer than its bytes");
            chars -= r.second - r.first;
            all = {std::min(all.first, r.first), r.second};
        }
        return all;
    }
    void string(FieldKind k, const char* tag, Layout& l) {
        const Field n = number(k, 8, tag);
        l.fields.push_back(n);
        bytes(n.value, tag);
    }
    Range payload(std::uint64_t n, Layout&) { return bytes(n, "data"); }
};

/// Xml bodies: one element per value, strings as element text (no length field).
struct XmlCursor {
    const std::vector<char>& b;
    std::size_t at = ckpt::header_size;
    Range element(const char* tag) {
        const std::string_view s(b.data(), b.size());
        const std::string open = std::string("<") + tag + ">", close = std::string("</") + tag + ">";
        const auto o = s.find(open, at);
        layout_check(o != std::string_view::npos, "a missing element");
        const auto c = s.find(close, o);
        layout_check(c != std::string_view::npos, "an element not closed");
        at = c + close.size();
        return {o + open.size(), c};
    }
    Field number(FieldKind k, std::size_t, const char* tag) {
        const Range r = element(tag);
        std::uint64_t v = 0;
        std::from_chars(b.data() + r.first, b.data() + r.second, v);
        return {k, r, v};
    }
    Range bytes(std::uint64_t, const char* tag) { return element(tag); }
    void string(FieldKind, const char* tag, Layout&) { element(tag); }
    Range payload(std::uint64_t, Layout&) { return element("data"); }
};

template <class Cursor>
Layout walk(Cursor c) {
    Layout l;
    auto add = [&](Field f) {
        l.fields.push_back(f);
        return f.value;
    };
    const std::uint64_t count = add(c.number(FieldKind::count, 8, "entries"));
    std::vector<std::uint64_t> payload_bytes;
    for (std::uint64_t i = 0; i < count; ++i) {
        c.string(FieldKind::name_length, "name", l);
        switch (static_cast<ckpt::ValueKind>(add(c.number(FieldKind::kind, 4, "kind")))) {
            case ckpt::ValueKind::tensor: {
                add(c.number(FieldKind::dtype, 4, "dtype"));
                const std::uint64_t rank = add(c.number(FieldKind::rank, 4, "rank"));
                std::vector<Field> dims;
                for (std::uint64_t d = 0; d < rank; ++d) dims.push_back(c.number(FieldKind::dim, 8, "dim"));
                const bool empty = std::any_of(dims.begin(), dims.end(), [](const Field& f) { return f.value == 0; });
                for (auto& d : dims) d.empty_tensor_dim = empty && d.value != 0;
                l.fields.insert(l.fields.end(), dims.begin(), dims.end());
                payload_bytes.push_back(add(c.number(FieldKind::nbytes, 8, "nbytes")));
                break;
            }
            case ckpt::ValueKind::int64:
            case ckpt::ValueKind::float64: add(c.number(FieldKind::scalar, 8, "value")); break;
            case ckpt::ValueKind::boolean: add(c.number(FieldKind::scalar, 4, "value")); break;
            case ckpt::ValueKind::string: c.string(FieldKind::string_length, "value", l); break;
        }
    }
    l.toc_end = c.at;
    for (auto n : payload_bytes) l.payloads.push_back(c.payload(n, l));
    l.end = c.at;
    return l;
}

Layout layout_of(const std::vector<char>& b, ckpt::ArchiveKind kind) {
    switch (kind) {
        case ckpt::ArchiveKind::binary: return walk(BinaryCursor{b});
        case ckpt::ArchiveKind::text: return walk(TextCursor(b));
        case ckpt::ArchiveKind::xml: return walk(XmlCursor{b});
    }
    return {};
}

// ----------------------------------------------------------------------------------------
// The corpus: real checkpoints, and the readers' verdicts on damaged copies of them.

/// Tensors big enough that the reader maps their blocks (detail::allocate_huge) rather than
/// allocating them, in every archive kind.
ckpt::ParamDict large_state() {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> w(1088 * 1024);  // 4.25 MiB
    for (auto& x : w) x = u(rng);
    std::vector<double> bias(4096);
    for (auto& x : bias) x = u(rng);
    ckpt::ParamDict d;
    d.set("big.weight", ckpt::Tensor::from(w, {1088, 1024}));
    d.set("big.bias", ckpt::Tensor::from(bias, {4096}));
    d.set("step", std::int64_t{123456});
    d.set("tag", std::string("a larger checkpoint"));
    return d;
}

struct Sample {
    std::string name;  // "small binary", ...
    ckpt::ArchiveKind kind;
    ckpt::ParamDict state;
    std::vector<char> bytes;
    Layout layout;
};

/// Each state saved in each archive kind, once per run of the binary.
const std::vector<Sample>& samples() {
    static const std::vector<Sample> all = [] {
        std::vector<Sample> out;
        TempDir dir(scratch_base());
        for (bool large : {false, true})
            for (auto kind : {ckpt::ArchiveKind::binary, ckpt::ArchiveKind::text, ckpt::ArchiveKind::xml}) {
                Sample s{std::string(large ? "large " : "small ") + std::string(ckpt::archive_kind_name(kind)), kind,
                         large ? large_state() : test::sample_state(), {}, {}};
                ckpt::SaveOptions o;
                o.archive = kind;
                ckpt::save_checkpoint(s.state, dir / "s.ckpt", o);
                s.bytes = test::read_bytes(dir / "s.ckpt");
                s.layout = layout_of(s.bytes, kind);
                out.push_back(std::move(s));
            }
        return out;
    }();
    return all;
}

bool is_small(const Sample& s) { return s.name.starts_with("small"); }

std::size_t tensor_count(const ckpt::ParamDict& d) {
    return static_cast<std::size_t>(
        std::count_if(d.begin(), d.end(), [](const auto& e) { return e.value.is_tensor(); }));
}

/// What a reader did with a file.
enum class Verdict { loaded, format, checksum, version, other_ckpt_error, other_exception };

const char* verdict_name(Verdict v) {
    switch (v) {
        case Verdict::loaded: return "loaded";
        case Verdict::format: return "FormatError";
        case Verdict::checksum: return "ChecksumError";
        case Verdict::version: return "VersionError";
        case Verdict::other_ckpt_error: return "another ckpt::Error";
        case Verdict::other_exception: return "a non-ckpt exception";
    }
    return "?";
}

constexpr std::size_t allocation_slack = 64 * 1024;
constexpr std::size_t refuse_above = 256u << 20;  // a reader fooled past this fails fast

/// Bytes the reader may map for a file of `size` bytes: allocate_huge maps one huge page
/// more than the block, rounded up to huge pages, to align it (and unmaps the excess).
std::size_t mapping_bound(std::size_t size) {
    const std::size_t hp = ckpt::detail::huge_page_size;
    return (size + allocation_slack + hp - 1) / hp * hp + hp;
}

class Corpus {
public:
    explicit Corpus(std::string what) : what_(std::move(what)), dir_(scratch_base()) {}
    fs::path file() const { return dir_ / "c.ckpt"; }

    /// The file must be rejected with `want` (FormatError meaning neither of its subtypes)
    /// and a message naming the file and containing one of `says`; by every reader, or by
    /// the two loads with verify_checkpoint passing when `sealed` (the edit was resealed).
    void expect_rejected(const Sample& s, Verdict want, std::vector<std::string_view> says, bool sealed = false) {
        ++tried_;
        const std::string path = file().string();
        const auto size = static_cast<std::size_t>(fs::file_size(file()));
        bool all_as_expected = true;
        ckpt::ParamDict target = target_for(s);
        const std::function<void()> readers[] = {
            [&] { ckpt::load_checkpoint(file()); },
            [&] { ckpt::load_checkpoint_into(file(), target); },
            [&] { ckpt::verify_checkpoint(file()); },
        };
        const std::string reader_names[] = {"load_checkpoint", "load_checkpoint_into", "verify_checkpoint"};
        for (int r = 0; r < 3; ++r) {
            const Verdict expected = sealed && r == 2 ? Verdict::loaded : want;
            auto [got, message, largest_new, largest_map] = attempt(readers[r]);
            INFO(s.name, ": ", reader_names[r], " on a ", size, "-byte file: ", std::string(verdict_name(got)), " ",
                 message);
            bool ok = got == expected;
            if (got != Verdict::loaded) {
                ok = ok && message.find(path) != std::string::npos &&
                     std::any_of(says.begin(), says.end(),
                                 [&](std::string_view w) { return message.find(w) != std::string::npos; });
                ++by_verdict_[verdict_name(got)];
            }
            CHECK_MESSAGE(ok, "expected ", std::string(verdict_name(expected)));
            CHECK_MESSAGE(largest_new <= size + allocation_slack, "an allocation of ", largest_new, " bytes");
            CHECK_MESSAGE(largest_map <= mapping_bound(size), "a mapping of ", largest_map, " bytes");
            all_as_expected = all_as_expected && ok && largest_new <= size + allocation_slack &&
                              largest_map <= mapping_bound(size);
            allocations_.note(largest_new, size);
            mappings_.note(largest_map, size);
        }
        rejected_ += all_as_expected;
    }

    void write(const std::vector<char>& bytes) const { test::write_bytes(file(), bytes); }

    std::string summary() const {
        std::ostringstream out;
        out << what_ << ": " << tried_ << " files tried, " << rejected_ << " rejected as expected by every reader (";
        const char* sep = "";
        for (const auto& [name, n] : by_verdict_) out << sep << n << " " << name, sep = ", ";
        out << "); largest operator new " << allocations_.largest << " bytes (for a " << allocations_.file
            << "-byte file), at most " << allocations_.excess << " bytes over the file's size";
        if (mappings_.largest)
            out << "; largest mapping " << mappings_.largest << " bytes (for a " << mappings_.file << "-byte file)";
        return out.str();
    }
    int tried() const { return tried_; }
    int rejected() const { return rejected_; }

private:
    struct Attempt {
        Verdict verdict;
        std::string message;
        std::size_t largest_new, largest_mapping;
    };

    static Attempt attempt(const std::function<void()>& read) {
        Verdict v = Verdict::loaded;
        std::string message;
        test::AllocationWatch watch(refuse_above);
        try {
            read();
        } catch (const ckpt::ChecksumError& e) {
            v = Verdict::checksum, message = e.what();
        } catch (const ckpt::VersionError& e) {
            v = Verdict::version, message = e.what();
        } catch (const ckpt::FormatError& e) {
            v = Verdict::format, message = e.what();
        } catch (const ckpt::Error& e) {
            v = Verdict::other_ckpt_error, message = e.what();
        } catch (const std::exception& e) {
            v = Verdict::other_exception, message = e.what();
        }
        watch.stop();
        return {v, std::move(message), watch.largest_new(), watch.largest_mapping()};
    }

    // A fresh copy of the state: a load into it may stream in part of a damaged file.
    static ckpt::ParamDict target_for(const Sample& s) {
        ckpt::ParamDict d;
        for (const auto& [name, value] : s.state)
            if (const auto* t = value.get_if<ckpt::Tensor>()) d.set(name, t->clone());
        return d;
    }

    struct Largest {
        std::size_t largest = 0, file = 0, excess = 0;
        void note(std::size_t bytes, std::size_t file_size) {
            if (bytes > largest) largest = bytes, file = file_size;
            if (bytes > file_size) excess = std::max(excess, bytes - file_size);
        }
    };

    std::string what_;
    TempDir dir_;
    int tried_ = 0, rejected_ = 0;
    std::map<std::string, int> by_verdict_;
    Largest allocations_, mappings_;
};

/// Which error a change to the byte at `offset` of a sealed file deserves, and what its
/// message says.
std::pair<Verdict, std::string_view> damage_verdict(std::size_t offset, const std::vector<Range>& header) {
    // header regions, sorted: magic, version, archive kind, ...
    if (offset < header[0].second) return {Verdict::format, "bad magic"};
    if (offset < header[1].second) return {Verdict::version, "format version"};
    if (offset < ckpt::header_size) return {Verdict::checksum, "corrupt header"};
    return {Verdict::checksum, "body xxh3"};
}

}  // namespace

TEST_SUITE("torture") {

TEST_CASE("the corpus's layouts are walked to the end of every real checkpoint") {
    // The tests below place their damage by these layouts: a walk that went astray would
    // test the wrong bytes.
    const auto header = header_regions();
    REQUIRE(header.size() == 9);
    CHECK(header.front() == Range(0, 8));
    CHECK(header.back() == Range(56, ckpt::header_size));
    for (std::size_t i = 1; i < header.size(); ++i) CHECK(header[i].first == header[i - 1].second);
    for (const auto& s : samples()) {
        CAPTURE(s.name);
        CHECK(s.layout.payloads.size() == tensor_count(s.state));
        CHECK(s.layout.fields.front().value == s.state.size());
        std::string_view rest(s.bytes.data() + s.layout.end, s.bytes.size() - s.layout.end);
        while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) rest.remove_prefix(1);
        while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.remove_suffix(1);
        CHECK((rest.empty() || rest == "</boost_serialization>"));
    }
}

TEST_CASE("bit flips anywhere are rejected as the header or body corruption they are") {
    const auto header = header_regions();
    Corpus corpus("bit flips");
    std::mt19937 rng(1);
    for (const auto& s : samples()) {
        corpus.write(s.bytes);
        const int flips = is_small(s) ? 120 : 30;
        for (int i = 0; i < flips; ++i) {
            // a third in the header, where each field has its own verdict
            const std::size_t end = i % 3 == 0 ? ckpt::header_size : s.bytes.size();
            const auto off = std::uniform_int_distribution<std::size_t>(0, end - 1)(rng);
            const char flipped = static_cast<char>(s.bytes[off] ^ (1 << (i % 8)));
            patch(corpus.file(), off, &flipped, 1);
            const auto [verdict, says] = damage_verdict(off, header);
            CAPTURE(off);
            corpus.expect_rejected(s, verdict, {says});
            patch(corpus.file(), off, &s.bytes[off], 1);
        }
    }
    MESSAGE(corpus.summary());
    CHECK(corpus.rejected() == corpus.tried());
    CHECK(corpus.tried() >= 450);
}

TEST_CASE("truncation at every region boundary of the format is rejected as truncation") {
    Corpus corpus("truncations");
    for (const auto& s : samples()) {
        std::set<std::size_t> cuts{0, s.bytes.size() - 1, s.layout.toc_end, s.layout.end};
        for (const auto& [b, e] : header_regions()) cuts.insert({b, e});
        for (const auto& f : s.layout.fields) cuts.insert({f.at.first, f.at.second});
        for (const auto& [b, e] : s.layout.payloads) cuts.insert({b, e, (b + e) / 2});
        corpus.write(s.bytes);
        for (auto it = cuts.rbegin(); it != cuts.rend(); ++it) {  // longest first: truncate() in place
            if (*it >= s.bytes.size()) continue;
            REQUIRE(::truncate(corpus.file().c_str(), static_cast<off_t>(*it)) == 0);
            CAPTURE(*it);
            corpus.expect_rejected(s, Verdict::format, {*it < ckpt::file_magic.size() ? "bad magic" : "truncated"});
        }
    }
    MESSAGE(corpus.summary());
    CHECK(corpus.rejected() == corpus.tried());
}

TEST_CASE("zeroed 4 KiB pages are rejected") {
    const auto header = header_regions();
    Corpus corpus("zeroed pages");
    constexpr std::size_t page = 4096;
    const std::vector<char> zeros(page, 0);
    for (const auto& s : samples()) {
        const std::size_t pages = (s.bytes.size() + page - 1) / page;
        std::set<std::size_t> chosen{0, pages - 1, s.layout.toc_end / page};
        for (const auto& [b, e] : s.layout.payloads) chosen.insert({b / page, (e - 1) / page});
        for (std::size_t i = 0; i < 24; ++i) chosen.insert(i * pages / 24);
        corpus.write(s.bytes);
        for (std::size_t p : chosen) {
            const std::size_t off = p * page, len = std::min(page, s.bytes.size() - off);
            if (std::all_of(s.bytes.begin() + static_cast<long>(off), s.bytes.begin() + static_cast<long>(off + len),
                            [](char c) { return c == 0; }))
                continue;  // zeroing would change nothing
            patch(corpus.file(), off, zeros.data(), len);
            CAPTURE(p);
            const auto [verdict, says] = damage_verdict(off, header);
            corpus.expect_rejected(s, verdict, {says});
            patch(corpus.file(), off, s.bytes.data() + off, len);
        }
    }
    MESSAGE(corpus.summary());
    CHECK(corpus.rejected() == corpus.tried());
    CHECK(corpus.tried() >= 6 * 8);
}

TEST_CASE("huge length fields in a resealed body are rejected without being allocated") {
    Corpus corpus("huge length fields, resealed");
    for (const auto& s : samples()) {
        for (const Field& f : s.layout.fields) {
            const bool length = f.kind == FieldKind::count || f.kind == FieldKind::name_length ||
                                f.kind == FieldKind::string_length || f.kind == FieldKind::rank ||
                                f.kind == FieldKind::nbytes || f.kind == FieldKind::pad ||
                                (f.kind == FieldKind::dim && !f.empty_tensor_dim);
            if (!length) continue;
            const bool narrow = f.at.second - f.at.first == 4 && s.kind == ckpt::ArchiveKind::binary;
            // 2^40, 2^62, -1, and what is left of the body after the field: the largest a
            // check against the body's size lets through.
            const std::uint64_t rest = s.bytes.size() - f.at.second;
            std::vector<std::uint64_t> values =
                narrow ? std::vector<std::uint64_t>{1ull << 31, 0xffffffffull}
                       : std::vector<std::uint64_t>{1ull << 40, 1ull << 62, ~0ull, rest};
            if (!is_small(s)) values = {values.back()};  // each costs megabytes of I/O
            for (std::uint64_t v : values) {
                if (v == f.value) continue;
                auto b = s.bytes;
                if (s.kind == ckpt::ArchiveKind::binary) {
                    for (std::size_t i = f.at.first; i < f.at.second; ++i)
                        b[i] = static_cast<char>((v >> (8 * (i - f.at.first))) & 0xff);
                } else {
                    const std::string text = v == ~0ull ? "-1" : std::to_string(v);
                    b.erase(b.begin() + static_cast<long>(f.at.first), b.begin() + static_cast<long>(f.at.second));
                    b.insert(b.begin() + static_cast<long>(f.at.first), text.begin(), text.end());
                }
                test::reseal(b);
                corpus.write(b);
                CAPTURE(f.at.first);
                CAPTURE(v);
                corpus.expect_rejected(s, Verdict::format, {"is malformed", "could not be parsed"}, true);
            }
        }
    }
    MESSAGE(corpus.summary());
    CHECK(corpus.rejected() == corpus.tried());
}

TEST_CASE("a resealed edit of payload bytes still loads: resealed edits reach the parser") {
    // The control for the test above: its files are rejected by the parser, not by a
    // checksum that resealing failed to fix.
    TempDir dir(scratch_base());
    for (const auto& s : samples()) {
        CAPTURE(s.name);
        const auto [begin, end] = s.layout.payloads.front();
        REQUIRE(end > begin);
        auto b = s.bytes;
        if (s.kind == ckpt::ArchiveKind::binary) b[begin] = static_cast<char>(b[begin] ^ 0x40);
        else b[begin] = b[begin] == 'A' ? 'B' : 'A';  // another base64 digit
        test::reseal(b);
        test::write_bytes(dir / "p.ckpt", b);
        const auto loaded = ckpt::load_checkpoint(dir / "p.ckpt");
        REQUIRE(loaded.size() == s.state.size());
        const std::string& first = std::find_if(s.state.begin(), s.state.end(),
                                                [](const auto& e) { return e.value.is_tensor(); })->name;
        CHECK(loaded.tensor(first).describe() == s.state.tensor(first).describe());
        CHECK_FALSE(loaded.tensor(first) == s.state.tensor(first));
        for (const auto& [name, value] : s.state)
            if (name != first) CHECK(loaded.at(name) == value);
    }
}

TEST_CASE("random garbage, behind no header, a valid header or a valid start, is rejected") {
    Corpus corpus("random garbage");
    std::mt19937_64 rng(3);
    auto random_bytes = [&](std::size_t n) {
        std::vector<char> b(n);
        for (auto& c : b) c = static_cast<char>(rng());
        return b;
    };
    auto with_header = [](ckpt::ArchiveKind kind, const std::vector<char>& body) {
        ckpt::FileHeader h;
        h.archive = kind;
        h.body_length = body.size();
        h.body_hash = ckpt::detail::xxh3(body.data(), body.size());
        const auto head = ckpt::encode_header(h);
        std::vector<char> b(reinterpret_cast<const char*>(head.data()),
                            reinterpret_cast<const char*>(head.data()) + head.size());
        b.insert(b.end(), body.begin(), body.end());
        return b;
    };
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{63},
                             std::size_t{64}, std::size_t{65}, std::size_t{100}, std::size_t{1000}, std::size_t{4096},
                             std::size_t{65536}, std::size_t{1} << 20, std::size_t{5} << 20}) {
        CAPTURE(size);
        const auto& any = samples().front();
        corpus.write(random_bytes(size));
        corpus.expect_rejected(any, Verdict::format, {"bad magic"});
        for (const auto& s : samples()) {
            if (!is_small(s)) continue;
            CAPTURE(s.name);
            const auto garbage = random_bytes(size);
            auto sealed = with_header(s.kind, garbage);
            corpus.write(sealed);
            corpus.expect_rejected(s, Verdict::format, {"is malformed", "could not be parsed"}, true);
            if (size > 0) {
                sealed[ckpt::header_size + size / 2] ^= 1;  // the header no longer matches the body
                corpus.write(sealed);
                corpus.expect_rejected(s, Verdict::checksum, {"body xxh3"});
            }
            // a real start of a body, cut inside its table of contents, then garbage
            const std::size_t keep = std::uniform_int_distribution<std::size_t>(
                ckpt::header_size + 1, s.layout.toc_end - 1)(rng);
            std::vector<char> body(s.bytes.begin() + ckpt::header_size, s.bytes.begin() + static_cast<long>(keep));
            const auto tail = random_bytes(size);
            body.insert(body.end(), tail.begin(), tail.end());
            corpus.write(with_header(s.kind, body));
            CAPTURE(keep);
            corpus.expect_rejected(s, Verdict::format, {"is malformed", "could not be parsed"}, true);
        }
    }
    MESSAGE(corpus.summary());
    CHECK(corpus.rejected() == corpus.tried());
}
}

