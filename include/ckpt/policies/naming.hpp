#pragma once
// NamingPolicy: the file name of each checkpoint, parsed back when looking for checkpoints.
//
// A NamingPolicy N provides
//   std::string checkpoint_name(std::string_view run_prefix, const Progress&, SaveKind)
//       the name, relative to the checkpoint directory (it may contain sub-directories);
//   std::optional<NameParts> parse(std::string_view base_prefix, std::string_view name)
//       the parts of one of its names for `base_prefix` (any run), or nothing;
//   std::string run_prefix(std::string_view base_prefix, const std::vector<std::string>& names, SaveKind)
//       the prefix a new run uses, given the names already in the directory;
//   std::string meta_name(std::string_view run_prefix)
//       the per-run description file, or "" for none;
//   int depth() -- how many directory levels below the checkpoint directory its names use.
// and may provide
//   static constexpr RetentionScope retention_scope
//       which runs' files retention manages by default (current_run when absent); a manager's
//       ManagerOptions::retention_scope overrides it.
//
// Members: MindSporeNaming (the seed's), StepNaming, LastWordsNaming (the seed's last-words
// layout) and SingleFileNaming (one file, replaced at every save: the do-nothing member).
// Retention scope by default: every run of the prefix, for MindSporeNaming and StepNaming (a
// bound on the disk that holds across restarts, like Orbax's max_to_keep; a job killed and
// started again 12 times keeps what its policy says, not that much per restart). The seed's
// tree, where every run keeps its own files, is RetentionScope::current_run. LastWordsNaming
// and SingleFileNaming have a single run, so both scopes are the same there.

#include <charconv>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"
#include "../progress.hpp"

namespace ckpt {

/// A regular checkpoint, or an exception save ("…_breakpoint.ckpt", ManagerOptions::exception_save).
enum class SaveKind { regular, breakpoint };

/// Which checkpoints retention manages (it deletes only regular checkpoints of the manager's
/// prefix and, for per-rank names, of its own rank).
enum class RetentionScope {
    current_run,  ///< this run's files only: each restart's files are kept as that run left them
    all_runs,     ///< every run of the prefix: the policy's bound holds across restarts
};

/// What a checkpoint's file name says, as a NamingPolicy parses it: the run and its prefix, the
/// position, the kind of save, and for last-words names the rank and global step.
struct NameParts {
    std::string run_prefix;        ///< "lenet" for run 0, "lenet_3" for run 3
    std::int64_t run = 0;
    bool positioned = true;        ///< false when the name carries no epoch/step
    /// false when the name carries the global step only (StepNaming): epoch and step are then
    /// 1 and the global step, as a loop without epochs counts, whatever the header says
    bool epoch_in_name = true;
    std::int64_t epoch = 0;
    std::int64_t step = 0;
    SaveKind kind = SaveKind::regular;
    int rank = -1;                 ///< last-words names only
    std::int64_t global_step = -1; ///< last-words names only
};

/// File names: checkpoint_name() makes one for a run prefix, a position and a kind; parse() reads
/// one back (any run of a prefix); run_prefix() picks a new run's prefix from the names present;
/// meta_name() names a run's meta file ("" for none); depth() says how many directory levels the
/// names use. Members: MindSporeNaming, StepNaming, LastWordsNaming, SingleFileNaming.
template <class N>
concept NamingPolicy = std::copy_constructible<N> &&
    requires(const N& n, std::string_view prefix, const Progress& p, const std::vector<std::string>& names) {
        { n.checkpoint_name(prefix, p, SaveKind::regular) } -> std::convertible_to<std::string>;
        { n.parse(prefix, prefix) } -> std::same_as<std::optional<NameParts>>;
        { n.run_prefix(prefix, names, SaveKind::regular) } -> std::convertible_to<std::string>;
        { n.meta_name(prefix) } -> std::convertible_to<std::string>;
        { n.depth() } -> std::convertible_to<int>;
    };

/// The retention scope `N` asks for: its `retention_scope` member, or current_run without one.
template <class N>
constexpr RetentionScope default_retention_scope() {
    if constexpr (requires { { N::retention_scope } -> std::convertible_to<RetentionScope>; })
        return N::retention_scope;
    else
        return RetentionScope::current_run;
}

namespace detail {

/// Parses a non-negative decimal number that is the whole of `s`.
inline std::optional<std::int64_t> parse_count(std::string_view s) {
    if (s.empty() || s.size() > 18) return std::nullopt;
    std::int64_t v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || v < 0) return std::nullopt;
    return v;
}

inline bool consume(std::string_view& s, std::string_view head) {
    if (!s.starts_with(head)) return false;
    s.remove_prefix(head.size());
    return true;
}

/// Splits "{base}-rest" (run 0) or "{base}_{N}-rest" (run N) into run and "rest".
inline std::optional<std::pair<std::int64_t, std::string_view>> split_run(std::string_view base,
                                                                           std::string_view name) {
    if (!consume(name, base)) return std::nullopt;
    if (consume(name, "-")) return std::pair{std::int64_t{0}, name};
    if (!consume(name, "_")) return std::nullopt;
    const auto dash = name.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    const auto run = parse_count(name.substr(0, dash));
    if (!run || *run == 0) return std::nullopt;
    return std::pair{*run, name.substr(dash + 1)};
}

/// Removes "_breakpoint.ckpt" or ".ckpt" from the end of `rest`, noting which it was.
inline bool strip_checkpoint_suffix(std::string_view& rest, SaveKind& kind) {
    constexpr std::string_view breakpoint = "_breakpoint.ckpt", regular = ".ckpt";
    if (rest.ends_with(breakpoint)) {
        kind = SaveKind::breakpoint;
        rest.remove_suffix(breakpoint.size());
        return true;
    }
    if (!rest.ends_with(regular)) return false;
    rest.remove_suffix(regular.size());
    return true;
}

/// Refuses a prefix that cannot safely be part of a file name, or that another prefix's run
/// names could produce: later runs of "exp" are "exp_1", "exp_2", … so a prefix "exp_1" would
/// be taken for one of them.
inline void check_prefix(std::string_view prefix) {
    auto refuse = [&](const std::string& why) {
        std::string shown;  // control characters as \xNN, so that the message stays one line
        for (const char c : prefix) {
            const auto u = static_cast<unsigned char>(c);
            if (u >= 0x20 && u != 0x7f) {
                shown += c;
                continue;
            }
            constexpr char hex[] = "0123456789abcdef";
            shown += std::string("\\x") + hex[u >> 4] + hex[u & 0xf];
        }
        throw ConfigError("checkpoint prefix '" + shown + "' " + why);
    };
    if (prefix.empty()) refuse("is empty: a prefix names the files of a job");
    if (prefix.size() > 200) refuse("is longer than 200 characters");
    if (prefix.find('/') != std::string_view::npos)  // most often a directory given where the prefix goes
        refuse("holds '/': a prefix names files in the checkpoint directory; the directory comes first, then the "
               "prefix (CheckpointManager(dir, prefix), nn::ModelCheckpoint(dir, prefix))");
    for (const char c : prefix) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) refuse("holds a control character");
        if (std::string_view("/\\*?[]\"<>|").find(c) != std::string_view::npos)
            refuse(std::string("holds '") + c + "', which cannot safely be part of a file name");
    }
    if (prefix.front() == '.' || prefix.front() == '-')
        refuse(std::string("starts with '") + prefix.front() + "'");
    if (const auto us = prefix.rfind('_'); us != std::string_view::npos && us + 1 < prefix.size() &&
                                           prefix.find_first_not_of("0123456789", us + 1) == std::string_view::npos)
        refuse("ends in '_" + std::string(prefix.substr(us + 1)) + "', as the runs of prefix '" +
               std::string(prefix.substr(0, us)) + "' do: its files would be taken for theirs (use '" +
               std::string(prefix.substr(0, us)) + "-" + std::string(prefix.substr(us + 1)) + "' or another name)");
    if (prefix.ends_with("_breakpoint")) refuse("ends in '_breakpoint', as exception-save file names do");
}

inline std::string run_prefix_name(std::string_view base, std::int64_t run) {
    return run == 0 ? std::string(base) : std::string(base) + "_" + std::to_string(run);
}

/// MindSpore's rule: the first run uses the prefix itself; a later run uses "{prefix}_{N}",
/// N one above the highest run present among names of the same kind.
template <class N>
std::string next_run_prefix(const N& naming, std::string_view base, const std::vector<std::string>& names,
                            SaveKind kind) {
    std::int64_t next = 0;
    for (const auto& n : names)
        if (auto parts = naming.parse(base, n); parts && parts->kind == kind) next = std::max(next, parts->run + 1);
    return run_prefix_name(base, next);
}

}  // namespace detail

namespace detail {

/// What the namings of the form "{run prefix}-{position}.ckpt" share: the breakpoint suffix,
/// MindSpore's run rule and the meta file. `Position` writes and parses the position part.
template <class Position>
struct RunNaming {
    std::string checkpoint_name(std::string_view run_prefix, const Progress& p, SaveKind kind) const {
        return std::string(run_prefix) + "-" + Position::format(p) +
               (kind == SaveKind::breakpoint ? "_breakpoint.ckpt" : ".ckpt");
    }

    std::optional<NameParts> parse(std::string_view base, std::string_view name) const {
        auto split = split_run(base, name);
        if (!split) return std::nullopt;
        auto [run, rest] = *split;
        NameParts parts;
        if (!strip_checkpoint_suffix(rest, parts.kind) || !Position::parse(rest, parts)) return std::nullopt;
        parts.run_prefix = run_prefix_name(base, run);
        parts.run = run;
        return parts;
    }

    std::string run_prefix(std::string_view base, const std::vector<std::string>& names, SaveKind kind) const {
        return next_run_prefix(*this, base, names, kind);
    }
    std::string meta_name(std::string_view run_prefix) const { return std::string(run_prefix) + "-graph.meta"; }
    int depth() const { return 0; }
};

struct EpochStepPosition {
    static std::string format(const Progress& p) { return std::to_string(p.epoch) + "_" + std::to_string(p.step); }
    static bool parse(std::string_view s, NameParts& parts) {
        const auto underscore = s.find('_');
        if (underscore == std::string_view::npos) return false;
        const auto epoch = parse_count(s.substr(0, underscore));
        const auto step = parse_count(s.substr(underscore + 1));
        if (!epoch || !step) return false;
        parts.epoch = *epoch;
        parts.step = *step;
        return true;
    }
};

struct GlobalStepPosition {
    static std::string format(const Progress& p) { return std::to_string(p.global_step); }
    static bool parse(std::string_view s, NameParts& parts) {
        const auto step = parse_count(s);
        if (!step) return false;
        parts.epoch = 1;
        parts.step = parts.global_step = *step;
        parts.epoch_in_name = false;
        return true;
    }
};

}  // namespace detail

/// The seed's names: "{prefix}-{epoch}_{step}.ckpt", "{prefix}-{epoch}_{step}_breakpoint.ckpt"
/// for exception saves, and "{prefix}-graph.meta". A second run with the same prefix in the
/// same directory uses "{prefix}_1-…", then "{prefix}_2-…", as MindSpore's code does (its
/// tutorial's tree shows "lenet-1-7_1875.ckpt", which the code never writes).
/// Retention manages every run's files (a bound across restarts); the seed's tree, which keeps
/// each run's files, is ManagerOptions::retention_scope = RetentionScope::current_run.
struct MindSporeNaming : detail::RunNaming<detail::EpochStepPosition> {
    static constexpr RetentionScope retention_scope = RetentionScope::all_runs;
};

/// Names by the global step: "{prefix}-{global_step}.ckpt" ("…_breakpoint.ckpt" for exception
/// saves), with MindSporeNaming's run rule and meta file; for loops without epochs, and for
/// loops with epochs too (the header keeps the epoch and step). Retention manages every run of the
/// prefix, so a job restarted many times keeps as many files as its policy says, not that
/// many per restart.
struct StepNaming : detail::RunNaming<detail::GlobalStepPosition> {
    static constexpr RetentionScope retention_scope = RetentionScope::all_runs;
};

/// The seed's last-words layout, relative to the last-words directory (ttp_checkpoints):
/// "tft_saved_checkpoints-step_{global_step}/rank_{rank}/ttp_rank_{rank}-{epoch}_{step}.ckpt".
/// The prefix is not part of these names; every save is its own step directory.
struct LastWordsNaming {
    std::string checkpoint_name(std::string_view, const Progress& p, SaveKind) const {
        const std::string r = std::to_string(p.rank);
        return "tft_saved_checkpoints-step_" + std::to_string(p.global_step) + "/rank_" + r + "/ttp_rank_" + r + "-" +
               std::to_string(p.epoch) + "_" + std::to_string(p.step) + ".ckpt";
    }

    std::optional<NameParts> parse(std::string_view base, std::string_view name) const {
        if (!detail::consume(name, "tft_saved_checkpoints-step_")) return std::nullopt;
        auto slash = name.find('/');
        const auto global = detail::parse_count(name.substr(0, slash));
        if (!global || slash == std::string_view::npos) return std::nullopt;
        name.remove_prefix(slash + 1);
        if (!detail::consume(name, "rank_")) return std::nullopt;
        slash = name.find('/');
        const auto rank = detail::parse_count(name.substr(0, slash));
        if (!rank || slash == std::string_view::npos) return std::nullopt;
        name.remove_prefix(slash + 1);
        if (!detail::consume(name, "ttp_rank_" + std::to_string(*rank) + "-") || !name.ends_with(".ckpt"))
            return std::nullopt;
        name.remove_suffix(5);
        const auto underscore = name.find('_');
        if (underscore == std::string_view::npos) return std::nullopt;
        const auto epoch = detail::parse_count(name.substr(0, underscore));
        const auto step = detail::parse_count(name.substr(underscore + 1));
        if (!epoch || !step || *rank > 1'000'000) return std::nullopt;
        NameParts parts;
        parts.run_prefix = std::string(base);
        parts.epoch = *epoch;
        parts.step = *step;
        parts.rank = static_cast<int>(*rank);
        parts.global_step = *global;
        return parts;
    }

    std::string run_prefix(std::string_view base, const std::vector<std::string>&, SaveKind) const {
        return std::string(base);
    }
    std::string meta_name(std::string_view) const { return {}; }
    int depth() const { return 2; }
};

/// One file, "{prefix}.ckpt", replaced atomically at every save: no numbering, no runs,
/// nothing for retention to do.
struct SingleFileNaming {
    std::string checkpoint_name(std::string_view run_prefix, const Progress&, SaveKind kind) const {
        return std::string(run_prefix) + (kind == SaveKind::breakpoint ? "_breakpoint.ckpt" : ".ckpt");
    }
    std::optional<NameParts> parse(std::string_view base, std::string_view name) const {
        NameParts parts;
        parts.run_prefix = std::string(base);
        parts.positioned = false;
        if (name == std::string(base) + ".ckpt") return parts;
        if (name == std::string(base) + "_breakpoint.ckpt") {
            parts.kind = SaveKind::breakpoint;
            return parts;
        }
        return std::nullopt;
    }
    std::string run_prefix(std::string_view base, const std::vector<std::string>&, SaveKind) const {
        return std::string(base);
    }
    std::string meta_name(std::string_view) const { return {}; }
    int depth() const { return 0; }
};

}  // namespace ckpt
