// Torture: a corpus of damaged checkpoints, each rejected with the error it deserves and
// without an allocation beyond the file's size; saves that run out of room in a real
// process; long random sequences of saves and damage under each retention policy and scope;
// a real process SIGKILLed and restarted many times, whose files stay bounded.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

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
    vary([](ckpt::FileHeader& h) { h.codecs.fill(static_cast<ckpt::CodecId>(0xff)); });
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
            default: throw std::logic_error("walk(): the tortured states hold the kinds 0 to 4 only");
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
                o.chunk_bytes = 0;  // the walker knows version 1 (version 3: test_open.cpp, test_golden.cpp)
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
            const Attempt result = attempt(readers[r]);
            const Verdict got = result.verdict;  // named, not bound: the lambdas below capture them
            const std::string& message = result.message;
            const std::size_t largest_new = result.largest_new, largest_map = result.largest_mapping;
            INFO(s.name, ": ", reader_names[r], " on a ", size, "-byte file: ", std::string(verdict_name(got)), " ",
                 message);
            // a resealed body misread can spell a value kind or dtype from the future (a name's
            // 'w' read as kind 119): refused as a newer writer's, still a kind of FormatError
            bool ok = got == expected || (expected == Verdict::format && got == Verdict::version);
            if (got != Verdict::loaded) {
                const bool newer = got == Verdict::version && message.find("does not know") != std::string::npos;
                ok = ok && message.find(path) != std::string::npos &&
                     (newer || std::any_of(says.begin(), says.end(),
                                           [&](std::string_view w) { return message.find(w) != std::string::npos; }));
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
/// message says. `version`: what the damaged file's version field reads. A number a writer
/// could have reached is a newer writer's as far as a reader can tell; another, in a header
/// that fails its check, is damage.
std::pair<Verdict, std::string_view> damage_verdict(std::size_t offset, const std::vector<Range>& header,
                                                    std::uint32_t version) {
    // header regions, sorted: magic, version, archive kind, ...
    if (offset < header[0].second) return {Verdict::format, "bad magic"};
    if (offset < header[1].second) {
        if (version >= 1 && version <= ckpt::max_plausible_format_version) return {Verdict::version, "format version"};
        return {Verdict::checksum, "corrupt header (format version field reads"};
    }
    if (offset < ckpt::header_size) return {Verdict::checksum, "corrupt header"};
    return {Verdict::checksum, "body xxh3"};
}

}  // namespace

TEST_SUITE("torture") {

TEST_CASE("the corpus's layouts are walked to the end of every real checkpoint") {
    // The tests below place their damage by these layouts: a walk that went astray would
    // test the wrong bytes.
    const auto header = header_regions();
    REQUIRE(header.size() == 10);
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
            std::vector<char> damaged(s.bytes.begin(), s.bytes.begin() + 12);
            if (off < damaged.size()) damaged[off] = flipped;
            const auto version = ckpt::detail::get_le<std::uint32_t>(reinterpret_cast<const std::byte*>(damaged.data()) + 8);
            const auto [verdict, says] = damage_verdict(off, header, version);
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
            const auto [verdict, says] = damage_verdict(off, header, 1);  // a page of zeros starts at the magic
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

// ----------------------------------------------------------------------------------------
// Out of room: a save that hits the file-size limit or a full file system, in a real process.

namespace {

using SpaceManager = ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming>;

/// What a forked child reported: its exit status and what it wrote to the pipe.
struct ChildReport {
    int status = -1;
    std::string text;
};

/// Runs `body` in a forked child; it appends its findings to the string it is given and
/// returns the exit status.
ChildReport in_child(const std::function<int(std::string&)>& body) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(fds[0]);
        std::string text;
        int status = 1;
        try {
            status = body(text);
        } catch (const std::exception& e) {
            text += std::string("uncaught exception: ") + e.what() + "\n";
        } catch (...) {
            text += "uncaught exception\n";
        }
        for (std::size_t done = 0; done < text.size();) {
            const ssize_t w = ::write(fds[1], text.data() + done, text.size() - done);
            if (w <= 0) break;
            done += static_cast<std::size_t>(w);
        }
        ::_exit(status);
    }
    ::close(fds[1]);
    ChildReport report;
    char buf[4096];
    for (ssize_t r; (r = ::read(fds[0], buf, sizeof buf)) != 0;) {
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        report.text.append(buf, static_cast<std::size_t>(r));
    }
    ::close(fds[0]);
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    report.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return report;
}

constexpr int child_skipped = 77;

enum class AsyncMode { sync, async_then_wait, async_then_next_call };

const char* mode_name(AsyncMode m) {
    switch (m) {
        case AsyncMode::sync: return "synchronous";
        case AsyncMode::async_then_wait: return "async, error at wait()";
        case AsyncMode::async_then_next_call: return "async, error at the next call";
    }
    return "?";
}

ckpt::ParamDict one_mib_state() {
    ckpt::ParamDict d;
    d.set("w", ckpt::Tensor::from(std::vector<float>(256 * 1024, 0.25f), {512, 512}));
    d.set("note", std::string("out of room"));
    return d;
}

/// Run in a child: two checkpoints saved, then `squeeze(checkpoint size)` leaves less room
/// than a third needs, which must fail with an IoError carrying `expected_errno`, naming the
/// file, leaving no temporary and the first two intact. Appends each problem found to `out`.
int out_of_room(const fs::path& dir, AsyncMode mode, int expected_errno,
                const std::function<void(std::uintmax_t)>& squeeze, std::string& out) {
    auto expect = [&](bool ok, const std::string& what) {
        if (!ok) out += what + "\n";
    };
    ckpt::set_log_sink([](ckpt::LogLevel, std::string_view) {});
    ckpt::ManagerOptions options;
    options.async_save = mode != AsyncMode::sync;
    const ckpt::ParamDict state = one_mib_state();
    const fs::path first = dir / "big-1.ckpt", second = dir / "big-2.ckpt", third = dir / "big-3.ckpt";
    {
        SpaceManager mgr(dir, "big", ckpt::EverySteps{1}, ckpt::KeepLast{5}, ckpt::StepNaming{}, options);
        mgr.save(ckpt::Progress::at_iteration(1), state);
        mgr.save(ckpt::Progress::at_iteration(2), state);
        mgr.wait();
        const auto before_first = test::read_bytes(first), before_second = test::read_bytes(second);
        squeeze(fs::file_size(second));

        std::optional<std::string> error;  // what the failed save threw
        auto attempt = [&](auto&& f) {
            try {
                f();
            } catch (const ckpt::IoError& e) {
                error = e.what();
                expect(e.error_code() == expected_errno, "errno " + std::to_string(e.error_code()) + ", expected " +
                                                              std::to_string(expected_errno) + ": " + e.what());
                expect(e.path() == third.string(), "the error names '" + e.path() + "': " + e.what());
            } catch (const std::exception& e) {
                out += std::string("not an IoError: ") + e.what() + "\n";
            }
        };
        attempt([&] { mgr.save(ckpt::Progress::at_iteration(3), state); });
        if (mode == AsyncMode::sync) {
            expect(error.has_value(), "the save that did not fit returned normally");
        } else {
            expect(!error, "an async save threw at the save call itself: " + error.value_or(""));
            if (mode == AsyncMode::async_then_wait)
                attempt([&] { mgr.wait(); });
            else
                attempt([&] { mgr.on_step(ckpt::Progress::at_iteration(4), state); });
            expect(error.has_value(), std::string("no IoError (") + mode_name(mode) + ")");
            try {
                mgr.wait();
            } catch (const std::exception& e) {
                out += std::string("the error was reported twice: ") + e.what() + "\n";
            }
        }
        if (error) {
            const std::string clear = "cannot write '" + third.string() + "': " + ckpt::detail::errno_text(expected_errno);
            expect(error->find(clear) != std::string::npos, "the message '" + *error + "' lacks '" + clear + "'");
        }
        const auto latest = mgr.latest();
        expect(latest && latest->path == second,
               "latest() is " + (latest ? latest->path.string() : std::string("nothing")) + ", expected " + second.string());
        expect(test::read_bytes(first) == before_first && test::read_bytes(second) == before_second,
               "an earlier checkpoint changed");
    }
    for (const auto& f : {first, second}) {
        try {
            ckpt::verify_checkpoint(f);
        } catch (const std::exception& e) {
            out += std::string("an earlier checkpoint does not verify: ") + e.what() + "\n";
        }
    }
    for (const auto& name : test::names_in(dir)) {
        expect(!ckpt::detail::temporary_owner(name), "a temporary was left behind: " + name);
        expect(name == "big-1.ckpt" || name == "big-2.ckpt" || name == "big-graph.meta" || name == "filler",
               "an unexpected file: " + name);
    }
    return 0;
}

/// Limits the size of any file this process writes; write() then fails with EFBIG.
void limit_file_size(std::uintmax_t checkpoint_size) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit r{};
    ::getrlimit(RLIMIT_FSIZE, &r);
    r.rlim_cur = static_cast<rlim_t>(checkpoint_size / 2);
    if (::setrlimit(RLIMIT_FSIZE, &r) != 0) throw std::runtime_error("setrlimit failed");
}

/// Fills the file system of `dir` but for about half a checkpoint.
void fill_but(const fs::path& dir, std::uintmax_t checkpoint_size) {
    const std::string filler = (dir / "filler").string();
    const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot create the filler");
    const std::vector<char> block(64 * 1024, 'f');
    off_t written = 0;
    for (ssize_t w; (w = ::write(fd, block.data(), block.size())) > 0;) written += w;
    if (errno != ENOSPC) throw std::runtime_error("filling stopped without ENOSPC");
    const off_t keep = written - static_cast<off_t>(checkpoint_size / 2);
    if (keep <= 0 || ::ftruncate(fd, keep) != 0) throw std::runtime_error("the file system is too small to fill");
    ::close(fd);
}

}  // namespace

TEST_SUITE("torture") {

TEST_CASE("a save past the file-size limit fails with a clear IoError and harms nothing") {
    for (auto mode : {AsyncMode::sync, AsyncMode::async_then_wait, AsyncMode::async_then_next_call}) {
        CAPTURE(std::string(mode_name(mode)));
        TempDir dir;
        const auto child = in_child([&](std::string& out) {
            return out_of_room(dir.path(), mode, EFBIG, limit_file_size, out);
        });
        CHECK(child.text == "");
        CHECK(child.status == 0);
        // and seen from outside the child
        CHECK(test::names_in(dir.path()) == std::vector<std::string>{"big-1.ckpt", "big-2.ckpt", "big-graph.meta"});
        CHECK_NOTHROW(ckpt::verify_checkpoint(dir / "big-2.ckpt"));
        const auto latest = ckpt::latest(dir.path(), "big", ckpt::StepNaming{});
        CHECK((latest && latest->filename() == "big-2.ckpt"));
    }
}

TEST_CASE("a save to a full file system fails with a clear IoError and harms nothing") {
    for (auto mode : {AsyncMode::sync, AsyncMode::async_then_wait}) {
        CAPTURE(std::string(mode_name(mode)));
        TempDir dir;
        const fs::path mount_point = dir / "small-fs";
        fs::create_directory(mount_point);
        const auto child = in_child([&](std::string& out) {
            // a mount namespace of its own, so that the small file system is the child's alone
            if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
                ::mount("ckpt-test", mount_point.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=8m") != 0) {
                out += std::string("cannot mount a tmpfs here: ") + std::strerror(errno);
                return child_skipped;
            }
            return out_of_room(mount_point, mode, ENOSPC,
                               [&](std::uintmax_t size) { fill_but(mount_point, size); }, out);
        });
        if (child.status == child_skipped) {
            MESSAGE("skipped: " << child.text);
            return;
        }
        CHECK(child.text == "");
        CHECK(child.status == 0);
    }
}
}

// ----------------------------------------------------------------------------------------
// Retention under random saves by three runs and random damage by hand.

namespace {

/// What the test knows of each file in the directory.
struct Known {
    enum Condition { valid, body_corrupt, unreadable };  // unreadable: the header does not check
    std::string run;   // run prefix: "r", "r_1", "rr"; the meta files' too
    std::int64_t step = 0;
    bool checkpoint = true;
    Condition condition = valid;
};

struct TortureFigures {
    int operations = 0, saves = 0, restarts = 0, retention_deletions = 0, meta_deletions = 0, damaged = 0,
        max_files = 0;
};

ckpt::ParamDict torture_state() {
    ckpt::ParamDict state;
    state.set("w", ckpt::Tensor::from(std::vector<float>(64, 0.5f)));
    return state;
}

/// The size of each checkpoint retention_torture() writes (they all have the same size).
std::uint64_t torture_file_size() {
    TempDir dir(scratch_base());
    ckpt::save_checkpoint(torture_state(), dir / "probe.ckpt");
    return fs::file_size(dir / "probe.ckpt");
}

/// Random saves by three runs (r, then r_1, of prefix r; and rr), random damage by hand; after
/// every operation, checks what retention deleted and kept. Runs r and r_1 write at once, as
/// two jobs of one series can where the series' lock does not hold (no flock, or ManagerOptions::lock
/// off): retention must still lose nothing either needs. `bound`: the readable checkpoints
/// the policy keeps of a run (current_run scope) or of a prefix (all_runs).
template <ckpt::RetentionPolicy R>
TortureFigures retention_torture(R policy, std::size_t bound, unsigned seed, int operations,
                                 ckpt::RetentionScope scope = ckpt::RetentionScope::current_run) {
    using Manager = ckpt::CheckpointManager<ckpt::EverySteps, R, ckpt::StepNaming>;
    TempDir dir(scratch_base());
    test::LogCapture quiet;
    std::mt19937 rng(seed);
    auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
    ckpt::ParamDict state = torture_state();
    ckpt::ManagerOptions options;
    options.retention_scope = scope;
    options.lock = false;
    // restore() passes over what the damage left unusable, as it did before refusing to start
    // over became the default (test_series.cpp tests the refusal)
    options.on_unreadable = ckpt::OnUnreadable::fall_back;
    const bool all_runs = scope == ckpt::RetentionScope::all_runs;
    auto prefix_of = [](const std::string& run) { return run == "rr" ? std::string("rr") : std::string("r"); };
    TortureFigures figures;
    std::map<std::string, Known> known;

    struct Run {
        std::unique_ptr<Manager> mgr;
        std::int64_t run_number = 0;
        std::int64_t step = 0;
    };
    std::vector<Run> runs;
    auto save = [&](Run& r) -> std::string {
        const std::string run = r.mgr->run_prefix();
        const std::string name = run + "-" + std::to_string(++r.step) + ".ckpt";
        state.tensor("w").values<float>()[0] = static_cast<float>(r.step);
        auto p = ckpt::Progress::at_iteration(r.step);
        p.metrics = {{"loss", static_cast<double>(std::hash<std::string>{}(name) % 1000) / 1000}};  // for KeepBest
        r.mgr->save(p, state);
        r.mgr->wait();  // retention's deletions freed: no hidden file of theirs left
        ++figures.saves;
        known[name] = {run, r.step, true, Known::valid};
        known.emplace(run + "-graph.meta", Known{run, 0, false, Known::valid});  // written again if gone
        const auto present = test::names_in(dir.path());
        std::set<std::string> thinned, metas_gone;  // runs that lost checkpoints, runs that lost their meta
        for (auto it = known.begin(); it != known.end();) {
            if (std::binary_search(present.begin(), present.end(), it->first)) {
                ++it;
                continue;
            }
            if (it->second.checkpoint) {
                // retention deleted it: only ever an older, readable checkpoint of the same run
                // (of the same prefix when every run is in scope)
                CHECK_MESSAGE((all_runs ? prefix_of(it->second.run) == prefix_of(run) : it->second.run == run),
                              "a save by run ", run, " deleted ", it->first);
                CHECK_MESSAGE(it->second.condition != Known::unreadable, "retention deleted unreadable ", it->first);
                CHECK_MESSAGE(it->first != name, "retention deleted the file just written");
                ++figures.retention_deletions;
                thinned.insert(it->second.run);
            } else {
                ++figures.meta_deletions;
                metas_gone.insert(it->second.run);
            }
            it = known.erase(it);
        }
        // A meta file goes exactly when retention took the last checkpoint of its run, never
        // the saving run's.
        auto has_checkpoint = [&](const std::string& of) {
            return std::any_of(known.begin(), known.end(),
                               [&](const auto& e) { return e.second.checkpoint && e.second.run == of; });
        };
        for (const auto& of : metas_gone)
            CHECK_MESSAGE((of != run && thinned.contains(of) && !has_checkpoint(of)), "a save by run ", run,
                          " deleted the meta file of run ", of);
        for (const auto& of : thinned)
            if (of != run && !has_checkpoint(of))
                CHECK_MESSAGE(!known.contains(of + "-graph.meta"), "run ", of, " lost its checkpoints, not its meta");
        CHECK_NOTHROW(ckpt::verify_checkpoint(dir / name));
        return name;
    };
    auto manager = [&](const char* prefix) {
        return std::make_unique<Manager>(dir.path(), prefix, ckpt::EverySteps{1}, policy, ckpt::StepNaming{}, options);
    };
    runs.push_back({manager("r"), 0, 0});
    REQUIRE(runs[0].mgr->run_prefix() == "r");
    save(runs[0]);  // so that the next manager of "r" is a later run
    runs.push_back({manager("r"), 1, 0});
    REQUIRE(runs[1].mgr->run_prefix() == "r_1");
    runs.push_back({manager("rr"), 0, 0});
    REQUIRE(runs[2].mgr->run_prefix() == "rr");
    auto run_number = [](const std::string& run) -> std::int64_t {  // "r" and "rr": 0, "r_N": N
        return run.starts_with("r_") ? std::stoll(run.substr(2)) : 0;
    };

    // The newest valid checkpoint of a prefix, by (run, step) as latest() orders them.
    auto newest_valid = [&](const std::string& prefix) -> std::optional<std::string> {
        std::optional<std::string> best;
        std::pair<std::int64_t, std::int64_t> best_key{-1, -1};
        for (const auto& [name, k] : known) {
            if (prefix_of(k.run) != prefix || !k.checkpoint || k.condition != Known::valid) continue;
            const std::pair key{run_number(k.run), k.step};
            if (key > best_key) best_key = key, best = name;
        }
        return best;
    };
    auto checkpoints = [&](auto&& keep) {
        std::vector<std::string> out;
        for (const auto& [name, k] : known)
            if (k.checkpoint && keep(k)) out.push_back(name);
        return out;
    };

    for (int op = 0; op < operations; ++op) {
        ++figures.operations;
        // With every run in scope, now and then a restart: a new run of r takes over from the
        // latest one (it stops saving), as a job started again after a kill.
        if (all_runs && pick(100) < 5) {
            runs[1] = {manager("r"), 0, 0};
            ++figures.restarts;
        }
        const int what = static_cast<int>(pick(100));
        const std::string prefix = what >= 55 && what < 65 ? "rr" : "r";
        const auto newest_before = newest_valid(prefix);
        std::string done, written;
        if (what < 40) {
            written = save(runs[0]), done = "save by r";
        } else if (what < 55) {
            written = save(runs[1]), done = "save by " + runs[1].mgr->run_prefix();
        } else if (what < 65) {
            written = save(runs[2]), done = "save by rr";
        } else {
            const auto candidates =
                what < 75 ? checkpoints([](const Known& k) { return k.run == "r" && k.condition == Known::valid; })
                : what < 85 ? checkpoints([](const Known& k) { return k.condition != Known::unreadable; })
                            : checkpoints([](const Known&) { return true; });
            if (candidates.empty()) continue;
            // the newest of run r for the first kind of damage, any file for the others
            std::string victim = candidates[pick(candidates.size())];
            if (what < 75)
                victim = *std::max_element(candidates.begin(), candidates.end(), [&](const auto& a, const auto& b) {
                    return known[a].step < known[b].step;
                });
            const fs::path file = dir / victim;
            auto bytes = test::read_bytes(file);
            ++figures.damaged;
            if (what < 75) {  // a bit flip in the newest file's body: its header still reads
                const auto off = ckpt::header_size + pick(bytes.size() - ckpt::header_size);
                test::flip_bit(file, off, static_cast<int>(pick(8)));
                known[victim].condition = Known::body_corrupt;
                done = "corrupt the body of the newest of r, " + victim;
            } else if (what < 85) {  // a bit flip anywhere in the header: it no longer reads
                test::flip_bit(file, pick(ckpt::header_size), static_cast<int>(pick(8)));
                known[victim].condition = Known::unreadable;
                done = "corrupt the header of " + victim;
            } else if (what < 93) {
                bytes.resize(pick(bytes.size()));
                test::write_bytes(file, bytes);
                known[victim].condition = Known::unreadable;
                done = "truncate " + victim;
            } else {
                fs::remove(file);
                known.erase(victim);
                done = "delete " + victim;
            }
        }
        INFO("operation ", op, ": ", done);
        const auto present = test::names_in(dir.path());
        figures.max_files = std::max(figures.max_files, static_cast<int>(present.size()));
        std::vector<std::string> expected;
        for (const auto& [name, k] : known) expected.push_back(name);
        REQUIRE(present == expected);  // nothing else deleted, no temporary left

        // Each run keeps at most the policy's bound of readable checkpoints (the ones it
        // counts; files whose header does not check are left alone). With every run in scope
        // the bound is the prefix's, plus the newest valid checkpoint when a save by run r
        // sorts before run r_1's files.
        std::set<std::string> runs_present;
        for (const auto& [name, k] : known) runs_present.insert(k.run);
        for (const auto& run : runs_present) {
            const auto readable = checkpoints([&](const Known& k) {
                const bool counted = all_runs ? prefix_of(k.run) == prefix_of(run) : k.run == run;
                return counted && k.condition != Known::unreadable;
            });
            const std::size_t most = all_runs && prefix_of(run) == "r" ? bound + 1 : bound;
            CHECK_MESSAGE(readable.size() <= most, (all_runs ? "prefix " : "run "), prefix_of(run), " keeps ",
                          readable.size(), " checkpoints");
        }
        // latest() finds the newest valid checkpoint of each prefix, across runs
        for (const auto& prefix_and_manager : {std::pair{std::string("r"), runs[0].mgr.get()}, {"rr", runs[2].mgr.get()}}) {
            const std::string& prefix = prefix_and_manager.first;
            const auto want = newest_valid(prefix);
            const auto got = prefix_and_manager.second->latest();
            CHECK_MESSAGE(got.has_value() == want.has_value(), "prefix ", prefix);
            if (got && want) CHECK(got->path.filename().string() == *want);
        }
        // a save never deletes the newest valid checkpoint of its prefix, unless the file it
        // just wrote is now the newest
        if (!written.empty() && newest_before)
            CHECK_MESSAGE((known.contains(*newest_before) || newest_valid(prefix) == written),
                          "the newest valid checkpoint ", *newest_before, " was deleted");
        // the test's picture of every file is right
        for (const auto& entry : known) {
            const std::string& name = entry.first;
            const Known& k = entry.second;
            if (!k.checkpoint) continue;
            Known::Condition actual = Known::valid;
            try {
                ckpt::verify_checkpoint(dir / name);
            } catch (const ckpt::FormatError&) {
                try {
                    ckpt::read_header(dir / name);
                    actual = Known::body_corrupt;
                } catch (const ckpt::FormatError&) {
                    actual = Known::unreadable;
                }
            }
            CHECK_MESSAGE(actual == k.condition, name);
        }
    }
    return figures;
}

std::string describe(const TortureFigures& f) {
    std::ostringstream out;
    out << f.operations << " operations: " << f.saves << " saves by three runs, " << f.damaged
        << " files damaged or deleted by hand, " << f.retention_deletions << " deleted by retention, at most "
        << f.max_files << " files in the directory";
    return out.str();
}

}  // namespace

TEST_SUITE("torture") {

TEST_CASE("retention torture: KeepLast under random saves, damage and other runs") {
    for (std::int64_t k : {1, 3}) {
        CAPTURE(k);
        const auto f = retention_torture(ckpt::KeepLast{k}, static_cast<std::size_t>(k), 100 + static_cast<unsigned>(k), 250);
        MESSAGE("KeepLast{" << k << "}: " << describe(f));
        CHECK(f.retention_deletions > 0);
    }
}

TEST_CASE("retention torture: KeepOnePerMinutes under random saves, damage and other runs") {
    // All saves fall within the hour: it keeps the oldest readable file and the newest.
    const auto f = retention_torture(ckpt::KeepOnePerMinutes{60}, 2, 200, 250);
    MESSAGE("KeepOnePerMinutes{60}: " << describe(f));
    CHECK(f.retention_deletions > 0);
}

TEST_CASE("retention torture: KeepUnion under random saves, damage and other runs") {
    using Union = ckpt::KeepUnion<ckpt::KeepLast, ckpt::KeepOnePerMinutes>;
    const auto f = retention_torture(Union(ckpt::KeepLast{2}, ckpt::KeepOnePerMinutes{60}), 3, 300, 250);
    MESSAGE("KeepUnion<KeepLast{2}, KeepOnePerMinutes{60}>: " << describe(f));
    CHECK(f.retention_deletions > 0);
}

TEST_CASE("retention torture: KeepBest, alone and with KeepLast, under random saves, damage and other runs") {
    // the best two and the file just written
    const auto best = retention_torture(ckpt::KeepBest{2, "loss"}, 3, 700, 250);
    MESSAGE("KeepBest{2}: " << describe(best));
    CHECK(best.retention_deletions > 0);
    using Union = ckpt::KeepUnion<ckpt::KeepLast, ckpt::KeepBest>;
    const auto both = retention_torture(Union(ckpt::KeepLast{1}, ckpt::KeepBest{2, "loss"}), 3, 800, 250);
    MESSAGE("KeepUnion<KeepLast{1}, KeepBest{2}>: " << describe(both));
    CHECK(both.retention_deletions > 0);
}

TEST_CASE("retention torture: every run in scope, KeepLast, KeepWithinBytes and KeepIntersection") {
    constexpr auto all_runs = ckpt::RetentionScope::all_runs;
    const auto size = torture_file_size();
    std::vector<std::pair<std::string, TortureFigures>> results;
    results.emplace_back("KeepLast{2}", retention_torture(ckpt::KeepLast{2}, 2, 400, 200, all_runs));
    // files of one size: a budget of 3.5 files keeps 3
    results.emplace_back("KeepWithinBytes{3.5 files}",
                         retention_torture(ckpt::KeepWithinBytes{3 * size + size / 2}, 3, 500, 200, all_runs));
    const ckpt::KeepIntersection last3_within(ckpt::KeepLast{3}, ckpt::KeepWithinBytes{2 * size + size / 2});
    results.emplace_back("KeepIntersection<KeepLast{3}, KeepWithinBytes{2.5 files}>",
                         retention_torture(last3_within, 2, 600, 200, all_runs));
    for (const auto& [what, f] : results) {
        MESSAGE(what << ", every run in scope: " << describe(f) << ", " << f.restarts << " restarts, "
                     << f.meta_deletions << " meta files deleted");
        CHECK(f.retention_deletions > 0);
        CHECK(f.meta_deletions > 0);
    }
}
}

// ----------------------------------------------------------------------------------------
// Retention across restarts: a real process saving a 5 MiB state, SIGKILLed at random moments
// and started again each time, as a preempted job is. Every restart is a new run; with every
// run in retention's scope the directory stays bounded by the policy.

namespace {

constexpr std::size_t restart_floats = (5u << 20) / sizeof(float);  // a 5 MiB state
constexpr const char* restart_prefix = "grow";

ckpt::ManagerOptions restart_options(bool async) {
    ckpt::ManagerOptions o;
    o.async_save = async;
    return o;
}

/// The restarted child: resumes from the newest checkpoint, then saves every step for ever,
/// reporting through `report_fd` each step of this life whose save and retention it knows
/// done: with sync saves the one just made; with async saves (one buffer) the one before,
/// since handing a save over waits until the previous one is written and pruned.
template <ckpt::RetentionPolicy R>
[[noreturn]] void restarted_child(const fs::path& dir, int report_fd, const R& policy, bool async) {
    try {
        ckpt::set_log_sink({});
        std::vector<float> w(restart_floats, 0.0f);
        ckpt::ParamDict state;
        state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
        ckpt::CheckpointManager<ckpt::EverySteps, R, ckpt::StepNaming> mgr(dir, restart_prefix, ckpt::EverySteps{1},
                                                                           policy, {}, restart_options(async));
        std::int64_t step = 0;
        if (auto r = mgr.restore(state)) step = r->file.name.step;
        const std::int64_t resumed = step;
        for (;;) {
            ++step;
            std::fill(w.begin(), w.end(), static_cast<float>(step));
            mgr.on_step(ckpt::Progress::at_iteration(step), state);
            const std::int64_t done = async ? step - 1 : step;
            if (done > resumed && ::write(report_fd, &done, sizeof done) != sizeof done) ::_exit(3);
        }
    } catch (...) {
        ::_exit(2);
    }
}

/// The last step reported after `reports` reports.
std::int64_t await_reports(int fd, int reports) {
    std::int64_t step = 0;
    for (int seen = 0; seen < reports; ++seen) {
        pollfd p{fd, POLLIN, 0};
        REQUIRE_MESSAGE(::poll(&p, 1, 30'000) == 1, "the restarted child stopped reporting");
        REQUIRE(::read(fd, &step, sizeof step) == sizeof step);
    }
    return step;
}

/// Floats a forked child does not inherit, so that the parent writes them between kills
/// without a copy-on-write fault per page.
class UnforkedFloats {
public:
    explicit UnforkedFloats(std::size_t n) : n_(n) {
        void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        ::madvise(p, bytes(), MADV_DONTFORK);
        data_ = static_cast<float*>(p);
    }
    ~UnforkedFloats() { ::munmap(data_, bytes()); }
    UnforkedFloats(const UnforkedFloats&) = delete;
    UnforkedFloats& operator=(const UnforkedFloats&) = delete;
    std::span<float> span() const { return {data_, n_}; }

private:
    std::size_t bytes() const { return n_ * sizeof(float); }
    float* data_ = nullptr;
    std::size_t n_;
};

struct RestartFigures {
    int kills = 0, killed_mid_save = 0, max_checkpoints = 0;
    std::int64_t newest = 0;
    double save_ms = 0;  // one save, as measured before the kills
};

/// The runs (run prefixes) that have checkpoints in `dir`, and those that have a meta file.
std::pair<std::set<std::string>, std::set<std::string>> runs_and_metas(const fs::path& dir) {
    std::set<std::string> runs, metas;
    for (const auto& f : ckpt::list_checkpoints(dir, restart_prefix, ckpt::StepNaming{}))
        runs.insert(f.name.run_prefix);
    for (const auto& name : test::names_in(dir))
        if (name.ends_with("-graph.meta") && !ckpt::detail::temporary_owner(name))
            metas.insert(name.substr(0, name.size() - std::string_view("-graph.meta").size()));
    return {runs, metas};
}

/// Starts the child `kills` times, SIGKILLs it at a random moment each time, and checks what
/// it leaves: at most the policy's `bound` of checkpoints plus those a kill can leave before
/// their retention ran, meta files only for runs with checkpoints (and the killed one's), and
/// a newest checkpoint that loads and is never older than a save reported done. A last life,
/// not killed, restores with latest()'s rules and leaves the bound exactly.
template <ckpt::RetentionPolicy R>
RestartFigures restart_torture(const R& policy, std::size_t bound, bool async, int kills, unsigned seed) {
    TempDir dir(scratch_base());
    test::LogCapture quiet;
    UnforkedFloats seen_memory(restart_floats);  // what the newest checkpoint holds, loaded after each kill
    const std::span<float> seen = seen_memory.span();
    ckpt::ParamDict seen_state;
    seen_state.set("w", ckpt::Tensor::view(seen, {static_cast<std::int64_t>(seen.size())}));
    // How long one save takes here, to spread the kills over a save's whole duration (the
    // faster of two: the first also maps the memory in).
    std::fill(seen.begin(), seen.end(), 0.0f);
    auto save_us = std::chrono::microseconds::max();
    for (int i = 0; i < 2; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        ckpt::save_checkpoint(seen_state, dir / "probe.ckpt");
        save_us = std::min(save_us, std::chrono::duration_cast<std::chrono::microseconds>(
                                        std::chrono::steady_clock::now() - t0));
    }
    fs::remove(dir / "probe.ckpt");

    RestartFigures figures;
    figures.save_ms = static_cast<double>(save_us.count()) / 1000;
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> reports(0, 2);
    std::uniform_int_distribution<long> delay_us(0, save_us.count() + 100);
    // The checkpoints a kill may leave: once a life has reported a save, its retention left
    // the bound, and one more save may have been committed before the kill; a life that
    // reported none may have added one file to what was there.
    std::size_t allowed = bound;
    std::int64_t reported_before = 0;
    for (int i = 0; i < kills; ++i) {
        int fds[2];
        REQUIRE(::pipe(fds) == 0);
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            ::close(fds[0]);
            restarted_child(dir.path(), fds[1], policy, async);
        }
        ::close(fds[1]);
        const int wanted = reports(rng);
        const std::int64_t reported = wanted ? await_reports(fds[0], wanted) : 0;
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
        ::kill(child, SIGKILL);
        int status = 0;
        ::waitpid(child, &status, 0);
        ::close(fds[0]);
        REQUIRE_MESSAGE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL), "the child failed, status ", status);
        ++figures.kills;
        allowed = wanted ? bound + 1 : allowed + 1;
        reported_before = std::max(reported_before, reported);
        INFO("life ", i, ": killed after ", wanted, " saves reported");

        const auto names = test::names_in(dir.path());
        // a save's temporaries (files retention deleted may be left too, as the kill stopped
        // the thread freeing them: the next manager removes them, as it does a save's)
        const auto temporaries = std::count_if(names.begin(), names.end(), [](const std::string& n) {
            return ckpt::detail::temporary_owner(n).has_value() && !ckpt::detail::is_deleted_temporary(n);
        });
        figures.killed_mid_save += temporaries > 0;
        CHECK(temporaries <= 1);
        const auto files = ckpt::list_checkpoints(dir.path(), restart_prefix, ckpt::StepNaming{});
        figures.max_checkpoints = std::max(figures.max_checkpoints, static_cast<int>(files.size()));
        CHECK_MESSAGE(files.size() <= allowed, files.size(), " checkpoints after ", i + 1, " kills, at most ", allowed,
                      " expected");
        const auto [runs, metas] = runs_and_metas(dir.path());
        std::vector<std::string> stray;  // meta files of runs without checkpoints: the killed run's at most
        std::set_difference(metas.begin(), metas.end(), runs.begin(), runs.end(), std::back_inserter(stray));
        CHECK_MESSAGE(stray.size() <= 1, stray.size(), " meta files without checkpoints");

        if (files.empty()) {
            REQUIRE(reported_before == 0);
            continue;
        }
        // Commits are atomic: the newest file by name is whole, and it is what latest() picks.
        const auto& newest = files.back();
        CHECK(newest.name.step >= reported_before);  // a save reported done is never lost
        CHECK(newest.name.step >= figures.newest);   // and resuming never goes backwards
        figures.newest = newest.name.step;
        std::fill(seen.begin(), seen.end(), -1.0f);
        CHECK_NOTHROW(ckpt::load_checkpoint_into(newest.path, seen_state, true));  // the checksum included
        const float expected = static_cast<float>(newest.name.step);
        CHECK(std::all_of(seen.begin(), seen.end(), [&](float v) { return v == expected; }));
    }
    // One more life that is not killed: after its save the policy's bound holds exactly, and
    // every meta file left belongs to a run that still has checkpoints (this run among them).
    {
        std::vector<float> w(restart_floats, 0.0f);
        ckpt::ParamDict state;
        state.set("w", ckpt::Tensor::view(std::span<float>(w), {static_cast<std::int64_t>(w.size())}));
        ckpt::CheckpointManager<ckpt::EverySteps, R, ckpt::StepNaming> mgr(dir.path(), restart_prefix,
                                                                           ckpt::EverySteps{1}, policy);
        const auto restored = mgr.restore(state);
        REQUIRE(restored);
        CHECK(restored->file.name.step == figures.newest);
        mgr.on_step(ckpt::Progress::at_iteration(figures.newest + 1), state);
        const auto files = ckpt::list_checkpoints(dir.path(), restart_prefix, ckpt::StepNaming{});
        CHECK(files.size() <= bound);
        CHECK(files.back().name.run_prefix == mgr.run_prefix());
        const auto [runs, metas] = runs_and_metas(dir.path());
        CHECK(std::includes(runs.begin(), runs.end(), metas.begin(), metas.end()));
        CHECK(metas.contains(mgr.run_prefix()));
        mgr.wait();  // what its retention deleted is freed
        for (const auto& name : test::names_in(dir.path())) CHECK_MESSAGE(!ckpt::detail::temporary_owner(name), name);
    }
    return figures;
}

std::string describe(const RestartFigures& f) {
    std::ostringstream out;
    out << f.kills << " kills, " << f.killed_mid_save << " of them during a save (of " << f.save_ms
        << " ms); newest step " << f.newest << ", at most " << f.max_checkpoints << " checkpoints in the directory";
    return out.str();
}

}  // namespace

TEST_SUITE("torture") {

TEST_CASE("retention torture: a process saving with KeepLast{2}, SIGKILLed and restarted 35 times, stays bounded") {
    const auto f = restart_torture(ckpt::KeepLast{2}, 2, false, 35, 700);
    MESSAGE("StepNaming, KeepLast{2}, synchronous saves: " << describe(f));
    CHECK(f.newest >= 35 / 2);  // the children made progress between kills
}

TEST_CASE("retention torture: a process saving with KeepWithinBytes, SIGKILLed and restarted 25 times, stays bounded") {
    // a budget of 2.5 checkpoints keeps 2
    const std::uint64_t file = ckpt::header_size + restart_floats * sizeof(float);
    const auto f = restart_torture(ckpt::KeepWithinBytes{file * 5 / 2}, 2, true, 25, 800);
    MESSAGE("StepNaming, KeepWithinBytes{2.5 checkpoints}, async saves: " << describe(f));
    CHECK(f.newest >= 25 / 2);
}
}
