#pragma once
// Saving and loading one checkpoint file: save_checkpoint, load_checkpoint,
// load_checkpoint_into (straight into existing tensors) and load_param_into_net.

#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "codecs/codec.hpp"
#include "detail/decode_budget.hpp"
#include "detail/entry.hpp"
#include "detail/linkage.hpp"
#include "detail/posix_io.hpp"
#include "error.hpp"
#include "format.hpp"
#include "param_dict.hpp"
#include "path.hpp"
#include "progress.hpp"

namespace ckpt {

namespace fs = boost::filesystem;

/// How save_checkpoint() writes a file: the body's archive, the position recorded in the header,
/// whether an existing file may be replaced, and the codecs the body passes through.
struct SaveOptions {
    ArchiveKind archive = ArchiveKind::binary;
    std::int64_t epoch = 0;  ///< recorded in the header; latest() checks it against the file name
    std::int64_t step = 0;   ///< likewise
    bool overwrite = true;   ///< false: fail with EEXIST rather than replace an existing file
    CodecChain codecs{};     ///< what the body passes through, in order (see codecs/codec.hpp); none by default
    /// A binary body without codecs is written as format version 3, whose table of contents
    /// holds the checksum of each piece of this many bytes of each tensor: ckpt::open() reads
    /// one entry, or a slice, and verifies only the pieces it reads. A power of two from 4 KiB
    /// to 1 GiB; 0 writes a version 1 file, which readers before version 3 read. Text and xml
    /// bodies, and bodies with codecs, are read whole, and have no pieces.
    std::uint64_t chunk_bytes = default_chunk_bytes;
    /// Threads that may hash those pieces (the caller's among them): 0 for the machine's cores.
    unsigned hash_threads = 0;
};

/// How a load reads a file: the archive kind it must have (any, unset), the key of an encrypted
/// body, and a bound on what the body may decode to.
struct LoadOptions {
    std::optional<ArchiveKind> archive;  ///< when set, a file of another archive kind is an error
    Key key{};                           ///< for encrypted checkpoints
    /// A body that would decode to more than this is refused (FormatError) before it is
    /// decoded. Unset: the larger of 256 MiB and 64 times the stored body (detail/decode_budget.hpp
    /// says why); UINT64_MAX: no limit, for files you trust.
    std::optional<std::uint64_t> max_decoded_bytes = std::nullopt;
};

/// What a load into existing tensors did, in the seed's terms.
struct LoadReport {
    std::vector<std::string> param_not_load;  ///< target tensors the checkpoint did not fill
    std::vector<std::string> ckpt_not_load;   ///< checkpoint tensors with no matching target
    std::vector<std::string> mismatches;      ///< same name, other dtype or shape (also in both lists above)
    ParamDict rest;                           ///< checkpoint entries not loaded into the target
    bool complete() const { return param_not_load.empty() && ckpt_not_load.empty(); }
};

/// One entry of a checkpoint's table of contents: name and kind; dtype, shape and size for a
/// tensor; the value itself for the other kinds.
using EntryInfo = detail::EntryMeta;

/// What read_contents() finds at the start of a file.
struct CheckpointContents {
    FileHeader header;
    std::vector<EntryInfo> entries;
};

/// Who wrote a checkpoint, as a CheckpointManager records it in every file it writes: its
/// prefix and the file's run prefix ("exp" and "exp_2"), and for an exception save the run of
/// regular checkpoints it continues. Names alone never decide whose a file is: a file named
/// like run 1 of "exp" that records prefix "exp_1" is not exp's. Files written without a
/// manager, or by versions before the record, hold none; their name is the only evidence.
struct CheckpointOwner {
    std::string prefix;
    std::string run_prefix;
    std::string follows_run;  ///< exception saves: the run prefix of the regular files it continues
    friend bool operator==(const CheckpointOwner&, const CheckpointOwner&) = default;
};

/// A type whose named state can be loaded in place: state_dict() returns views of its tensors.
template <class T>
concept HasStateDict = requires(T& t) {
    { t.state_dict() } -> std::same_as<ParamDict>;
};

/// A target whose tensors depend on what the checkpoint holds: an optimizer whose per-parameter
/// state its first step creates, a container resized to fit. A load calls state_dict_for()
/// with the file's table of contents before it reads any payload, and loads into the views it
/// returns (a load that falls back to an older file calls it again, for that file); once a
/// load has succeeded, loaded() finishes the job (hands a generator's state back, say).
template <class T>
concept ShapedByCheckpoint = requires(T& t, const std::vector<EntryInfo>& entries, const LoadReport& report) {
    { t.state_dict_for(entries) } -> std::same_as<ParamDict>;
    t.loaded(report);
};

namespace detail {

/// The encoding a type with serialize() takes in a checkpoint of archive kind `k`: Boost's
/// binary archive in binary bodies, its text archive in text and xml ones.
constexpr ObjectEncoding boost_encoding(ArchiveKind k) {
    return k == ArchiveKind::binary ? ObjectEncoding::boost_binary : ObjectEncoding::boost_text;
}

std::int64_t unix_time_ns();
std::string hex64(std::uint64_t v);

// The owner record is kept in entries whose names start with "__ckpt.": a manager refuses
// such names in a user's state, and loads leave them out of what they return. The writer's
// storage-order records ("__ckpt.order.{name}", detail/entry.hpp) are folded into their
// tensors' entries as a body is read.
inline constexpr std::string_view reserved_name_prefix = "__ckpt.";
inline constexpr std::string_view owner_prefix_entry = "__ckpt.prefix";
inline constexpr std::string_view owner_run_entry = "__ckpt.run";
inline constexpr std::string_view owner_follows_entry = "__ckpt.follows_run";
// Progress::metrics are kept as doubles named "__ckpt.metric.{name}".
inline constexpr std::string_view metric_entry_prefix = "__ckpt.metric.";
// A rank's part of a step that several ranks save together (fault::ReplicaParallel) says so
// in a string entry, what it holds and how its step loads: the one reserved name a state may
// carry to a manager. A load of the file alone that does not fit its target adds it to the
// error.
inline constexpr std::string_view share_record_entry = "__ckpt.share";

inline bool is_reserved_name(std::string_view name) { return name.starts_with(reserved_name_prefix); }

void record_owner(ParamDict& dict, const CheckpointOwner& owner);
/// The owner record among a table of contents' entries, or nothing when there is none.
std::optional<CheckpointOwner> owner_in(const std::vector<EntryMeta>& toc);
/// The share record (share_record_entry) among a table of contents' entries, if any.
std::optional<std::string> share_in(const std::vector<EntryMeta>& toc);
/// Adds the finite ones of `metrics` to `dict`; returns the names of those left out (NaN,
/// infinite). An empty name is a ConfigError.
std::vector<std::string> record_metrics(ParamDict& dict, const Metrics& metrics);
/// The metrics a table of contents records (Progress::metrics), by name.
std::map<std::string, double> recorded_metrics(const std::vector<EntryMeta>& toc);
/// recorded_metrics(), and the table of contents' other int64 and double values by name (a
/// recorded metric wins over a value of the same name).
std::map<std::string, double> metrics_in(const std::vector<EntryMeta>& toc);

struct OpenedCheckpoint {
    Fd fd;
    FileHeader header;
};

OpenedCheckpoint open_checkpoint(const std::string& path, const LoadOptions& opts);
/// Reads the whole body into one aligned block and checks it against the header.
std::shared_ptr<std::byte> read_verified_body(OpenedCheckpoint& c, const std::string& path);
/// The verified body with its codecs undone: what the archive wrote. An outermost stage that
/// can decode while the body is read (aes-256-gcm) does; a damaged body is still a
/// ChecksumError before it is any codec's error.
BodyBytes read_decoded_body(OpenedCheckpoint& c, const std::string& path, const LoadOptions& opts);
/// The table of contents of a decoded body (read_decoded_body).
std::vector<EntryMeta> decoded_toc(const FileHeader& header, const BodyBytes& body, const std::string& path);
/// A format version 3 file's table of contents, checked against its toc_check (ChecksumError
/// otherwise), with its chunk size and the file offset of each tensor's payload.
struct CheckedToc {
    std::vector<EntryMeta> entries;
    std::uint64_t chunk_bytes = 0;
    std::map<std::string, std::uint64_t> payload_offsets;
};
CheckedToc read_checked_toc(OpenedCheckpoint& c, const std::string& path);
/// verify_checkpoint(), its errors not translated (detail::reading).
FileHeader verify_opened(const std::string& path, const LoadOptions& opts);
/// read_contents() of an opened file, or, with `decode_encoded` false, only its header for a
/// body that passed through codecs (entries left empty): what a cheap look at a file costs.
CheckpointContents contents_of(OpenedCheckpoint& c, const std::string& path, const LoadOptions& opts,
                               bool decode_encoded);
/// Runs `f`; a LoadMismatch from it (a target's state_dict_for() or loaded(), which do not know
/// where the state comes from) is rethrown naming `source` ("'path'"), unless it names it.
template <class F>
decltype(auto) naming_source(const std::string& source, F&& f) {
    try {
        return f();
    } catch (const LoadMismatch& e) {
        const std::string what = e.what();
        if (what.find(source) != std::string::npos) throw;
        throw LoadMismatch("loading " + source + ": " + what);
    }
}
/// Rebuilds a load's target after the table of contents (ShapedByCheckpoint::state_dict_for).
using TargetShaper = std::function<void(const std::vector<EntryMeta>& toc, ParamDict& target)>;

template <ShapedByCheckpoint T>
TargetShaper shaper_of(T& t) {
    return [&t](const std::vector<EntryMeta>& toc, ParamDict& target) { target = t.state_dict_for(toc); };
}

/// load_param_into_net(); an object's state_dict() values are copies (`values_are_copies`);
/// `shape`, when given, first rebuilds the target after `src`'s entries. `source` is what a
/// strict failure says was loaded ("a ParamDict", or the file it was read from, quoted).
LoadReport load_param_into(ParamDict& target, const ParamDict& src, bool strict, bool values_are_copies,
                           const TargetShaper* shape = nullptr, const std::string& source = "a ParamDict");
/// load_checkpoint_into(), likewise.
LoadReport load_file_into(const PathArg& file, ParamDict& target, bool strict, const LoadOptions& opts,
                          bool values_are_copies, const TargetShaper* shape = nullptr);

}  // namespace detail

/// Writes `dict` to `file` atomically and durably (see detail/atomic_file.hpp). On any error
/// the previous file at `file`, if any, is untouched and no temporary is left behind.
/// @throws IoError `file` cannot be written (no such directory, no permission, disk full), or
///         it exists and `opts.overwrite` is false
/// @throws ConfigError `dict` holds what the archive cannot (a reserved entry name, a tensor of
///         too high a rank, a non-finite double in a text or xml archive), or `opts.codecs` is
///         not a valid chain (a codec not compiled in, encryption not last)
/// @throws KeyError `opts.codecs` encrypts without a key
void save_checkpoint(const ParamDict& dict, const PathArg& file, const SaveOptions& opts = {});

/// Reads and checks the header only (64 bytes): cheap, but says nothing about the body.
FileHeader read_header(const PathArg& file);

/// Reads the header and the table of contents, never the tensor payloads: cheap for a file of
/// any size. The body checksum is not checked (that needs every byte; verify_checkpoint).
/// A body that passed through codecs is the exception: it is read, verified and decoded whole
/// (an encrypted one needs opts.key).
CheckpointContents read_contents(const PathArg& file, const LoadOptions& opts = {});

/// Reads the whole file and checks header and body checksum; throws if anything is wrong.
FileHeader verify_checkpoint(const PathArg& file, const LoadOptions& opts = {});

/// Loads every entry into a new ParamDict. The body is verified before anything in it is
/// parsed; binary payloads are not copied again after the read.
/// @throws IoError `file` cannot be opened or read
/// @throws FormatError not a checkpoint, truncated or malformed, of another archive kind than
///         `opts.archive`, or a body that would decode to more than `opts.max_decoded_bytes`
/// @throws ChecksumError the header or the body does not match its checksum
///         (AuthenticationError: an encrypted body fails authentication)
/// @throws VersionError a format version, archive kind or codec this reader does not know
/// @throws KeyError encrypted, and `opts.key` is not its key (or not set)
/// @throws ConfigError the file needs a codec this program lacks (include its header)
ParamDict load_checkpoint(const PathArg& file, const LoadOptions& opts = {});

/// Copies the tensors of `src` into the same-named tensors of `target` (often views of a
/// network's parameters), its int64, double and bool values into views of scalars, and
/// values into the target's values of the same kind. Other entries of `src` go to
/// report.rest. Strict: any missing, unexpected or mismatched tensor throws LoadMismatch
/// naming all of them, before anything is copied.
/// @throws LoadMismatch strict, and a tensor is missing, unexpected, or of another dtype or
///         shape; or a bound variable cannot take its stored value
LoadReport load_param_into_net(ParamDict& target, const ParamDict& src, bool strict = false);

/// Into an object's state_dict(): its values are copies, which nothing can write back (a
/// strict load names them; use views of scalars, ckpt::view_of).
template <HasStateDict T>
    requires(!ShapedByCheckpoint<T>)
LoadReport load_param_into_net(T& net, const ParamDict& src, bool strict = false) {
    ParamDict views = net.state_dict();
    return detail::load_param_into(views, src, strict, true);
}
/// Into a target shaped after `src`'s entries (ShapedByCheckpoint), then finished by its loaded().
template <ShapedByCheckpoint T>
LoadReport load_param_into_net(T& target, const ParamDict& src, bool strict = false) {
    ParamDict views;
    const auto shape = detail::shaper_of(target);
    auto report = detail::load_param_into(views, src, strict, false, &shape);
    target.loaded(report);
    return report;
}

/// Loads straight into the memory of `target`'s tensors. Binary archives stream from the file
/// into them, an aes-256-gcm body too (each segment decrypted in place there); text and xml,
/// and bodies that passed through other codecs, go through a verified in-memory copy. The
/// body checksum is checked at the end: if it fails (ChecksumError), or an encrypted segment
/// fails authentication (AuthenticationError), the target tensors may hold partial data, so
/// reload them from another checkpoint. Strict mode checks names, dtypes and shapes against
/// the file's table of contents before writing any payload.
/// A ParamDict target's own values (int64, double, bool, string) are replaced by the
/// checkpoint's of the same name and kind.
/// @throws IoError `file` cannot be opened or read
/// @throws FormatError not a checkpoint, truncated or malformed, of another archive kind than
///         `opts.archive`, or a body that would decode to more than `opts.max_decoded_bytes`
/// @throws ChecksumError the header or the body does not match its checksum
///         (AuthenticationError: an encrypted body fails authentication); the target's
///         tensors may then hold partial data
/// @throws VersionError a format version, archive kind or codec this reader does not know
/// @throws KeyError encrypted, and `opts.key` is not its key (or not set)
/// @throws ConfigError the file needs a codec this program lacks (include its header)
/// @throws LoadMismatch strict, and the file's tensors do not match the target's names,
///         dtypes or shapes (before any payload is written); or a bound variable cannot take
///         its stored value
LoadReport load_checkpoint_into(const PathArg& file, ParamDict& target, bool strict = false,
                                const LoadOptions& opts = {});

/// Into an object's state_dict(): its values are copies, which nothing can write back (a
/// strict load names them, before anything is loaded; use views of scalars, ckpt::view_of).
template <HasStateDict T>
    requires(!ShapedByCheckpoint<T>)
LoadReport load_checkpoint_into(const PathArg& file, T& net, bool strict = false, const LoadOptions& opts = {}) {
    ParamDict views = net.state_dict();
    return detail::load_file_into(file, views, strict, opts, true);
}
/// Into a target shaped after the file's table of contents (ShapedByCheckpoint), then
/// finished by its loaded().
template <ShapedByCheckpoint T>
LoadReport load_checkpoint_into(const PathArg& file, T& target, bool strict = false, const LoadOptions& opts = {}) {
    ParamDict views;
    const auto shape = detail::shaper_of(target);
    auto report = detail::load_file_into(file, views, strict, opts, false, &shape);
    detail::naming_source("'" + file.string() + "'", [&] { target.loaded(report); });
    return report;
}

}  // namespace ckpt

#ifndef CKPT_SEPARATE_COMPILATION
#include "impl/checkpoint.ipp"
#endif
