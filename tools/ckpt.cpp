// ckpt: look inside checkpoints, check them, compare them, move their tensors to and from
// safetensors and NumPy's npz, bring in PyTorch's torch.save files, and draw the metrics they
// record.
//
//   ckpt ls DIR [--prefix P] [--headers-only] [--best METRIC[:min|max]] [--json] [--clean]
//   ckpt show FILE [--stats] [--json] [--entry NAME]
//   ckpt verify FILE|DIR ...
//   ckpt diff A B [--atol X] [--rtol Y]
//   ckpt export FILE OUT.safetensors|OUT.npz [--select REGEX] [--rename FROM=TO]... [--compress] [--force]
//   ckpt import IN.safetensors|IN.npz|IN.pt|IN.pth OUT.ckpt [--epoch E] [--step S] [--archive KIND] [--select] [--rename] [--force]
//   ckpt plot DIR --metric NAME [--metric NAME ...] -o FILE.png [--prefix P] [--force] [--timeout S]
//
// Exit status: 0 success (for diff: equal within tolerance; for verify: every file verified),
// 1 failure (for diff: a difference), 2 a usage error.

#include <ckpt/ckpt.hpp>
#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/interop.hpp>
#include <ckpt/reshard.hpp>
#include <ckpt/codecs/zstd.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

extern char** environ;

namespace {

namespace fs = boost::filesystem;
using json = nlohmann::ordered_json;

/// A failure the tool reports and exits 1 for (a usage error is CLI11's, exit 2).
struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::string human_size(std::uint64_t n) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(n);
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, ++u;
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
    return buf;
}

std::string utc_time(std::int64_t ns) {
    const std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string hex64(std::uint64_t v) { return ckpt::detail::hex64(v); }

/// A name, path, prefix or value that came from a file or a directory, as text output shows it:
/// control characters (ESC, BEL, CR, ...) and bytes that are not UTF-8 escaped as \xNN, as
/// error messages are (ckpt::detail::printable), and line breaks and tabs too, so that it
/// stays on its line.
std::string shown(std::string_view s) {
    std::string out;
    for (const char c : ckpt::detail::printable(s)) {
        if (c == '\n') out += "\\x0a";
        else if (c == '\t') out += "\\x09";
        else out += c;
    }
    return out;
}
std::string shown(const std::string& s) { return shown(std::string_view(s)); }

/// "1 entry", "3 entries".
std::string entries_count(std::size_t n) { return std::to_string(n) + (n == 1 ? " entry" : " entries"); }
std::string shown(const char* s) { return shown(std::string_view(s)); }
std::string shown(const fs::path& p) { return shown(std::string_view(p.string())); }

/// `s` as a JSON string. Exact, and safe on a terminal: what JSON escapes, DEL and the C1
/// controls as \u00XX, and each byte that is not part of valid UTF-8 (FORMAT.md allows any
/// bytes in names and strings) as \udcXX, the lone surrogate Python's surrogateescape reads
/// back as that byte.
std::string json_quoted(std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out = "\"";
    auto u = [&](unsigned v) {
        out += "\\u";
        for (int shift = 12; shift >= 0; shift -= 4) out += hex[(v >> shift) & 15];
    };
    for (std::size_t i = 0; i < s.size();) {
        const auto b = static_cast<unsigned char>(s[i]);
        if (b < 0x80) {
            switch (b) {
                case '"': out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\b': out += "\\b"; break;
                case '\f': out += "\\f"; break;
                case '\n': out += "\\n"; break;
                case '\r': out += "\\r"; break;
                case '\t': out += "\\t"; break;
                default:
                    if (b < 0x20 || b == 0x7f) u(b);
                    else out += static_cast<char>(b);
            }
            ++i;
            continue;
        }
        // a multi-byte sequence, checked as detail::printable checks it
        const std::size_t n = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
        std::uint32_t cp = n == 2 ? b & 0x1fu : n == 3 ? b & 0x0fu : b & 0x07u;
        bool valid = n != 0 && i + n <= s.size();
        for (std::size_t k = 1; valid && k < n; ++k) {
            const auto c = static_cast<unsigned char>(s[i + k]);
            valid = (c & 0xc0) == 0x80;
            cp = (cp << 6) | (c & 0x3fu);
        }
        valid = valid && !(n == 3 && cp < 0x800) && !(n == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
                !(cp >= 0xd800 && cp <= 0xdfff);
        if (!valid) {
            u(0xdc00 + b);
            ++i;
        } else if (cp <= 0x9f) {  // C1 controls
            u(cp);
            i += n;
        } else {
            out.append(s.substr(i, n));
            i += n;
        }
    }
    return out + "\"";
}

/// `j` as nlohmann's dump(2) lays it out, its strings written by json_quoted(): exact whatever
/// bytes a name holds, where dump() throws on bytes that are not UTF-8.
void write_json(std::string& out, const json& j, int indent = 0) {
    const std::string pad(static_cast<std::size_t>(indent) + 2, ' ');
    if (j.is_object()) {
        if (j.empty()) return void(out += "{}");
        out += "{\n";
        bool first = true;
        for (const auto& [key, value] : j.items()) {
            out += (first ? "" : ",\n") + pad + json_quoted(key) + ": ";
            write_json(out, value, indent + 2);
            first = false;
        }
        out += "\n" + std::string(static_cast<std::size_t>(indent), ' ') + "}";
    } else if (j.is_array()) {
        if (j.empty()) return void(out += "[]");
        out += "[\n";
        bool first = true;
        for (const auto& value : j) {
            out += (first ? "" : ",\n") + pad;
            write_json(out, value, indent + 2);
            first = false;
        }
        out += "\n" + std::string(static_cast<std::size_t>(indent), ' ') + "]";
    } else if (j.is_string()) {
        out += json_quoted(j.get_ref<const std::string&>());
    } else {
        out += j.dump();
    }
}

std::string json_text(const json& j) {
    std::string out;
    write_json(out, j);
    return out;
}

std::string object_text(const ckpt::Object& o);
json object_json(const ckpt::Object& o);

std::string hex_text(std::string_view bytes) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    for (const char c : bytes) {
        out += hex[static_cast<unsigned char>(c) >> 4];
        out += hex[static_cast<unsigned char>(c) & 15];
    }
    return out;
}

/// The start of `text` and how much was left out, for values that can be long.
std::string shortened(const std::string& text, std::size_t at_most = 200) {
    if (text.size() <= at_most) return text;
    return text.substr(0, at_most) + "… (" + std::to_string(text.size()) + " characters)";
}

std::string scalar_text(const ckpt::Value& v) {
    if (auto* i = v.get_if<std::int64_t>()) return std::to_string(*i);
    if (auto* d = v.get_if<double>()) return ckpt::detail::double_text(*d);
    if (auto* b = v.get_if<bool>()) return *b ? "true" : "false";
    if (auto* s = v.get_if<std::string>()) return shortened(json_quoted(*s));
    if (auto* b = v.get_if<ckpt::Bytes>())
        return std::to_string(b->data.size()) + " bytes" +
               (b->data.empty() ? "" : ": " + hex_text(std::string_view(b->data).substr(0, 32)) + (b->data.size() > 32 ? "…" : ""));
    if (auto* list = v.get_if<ckpt::Strings>()) {
        std::string out = "[";
        for (std::size_t k = 0; k < list->size() && out.size() < 200; ++k) out += (k ? ", " : "") + json_quoted((*list)[k]);
        return shortened(out + "]") + " (" + std::to_string(list->size()) + " strings)";
    }
    if (auto* o = v.get_if<ckpt::Object>()) return object_text(*o);
    return "";
}

json scalar_json(const ckpt::Value& v) {
    if (auto* i = v.get_if<std::int64_t>()) return *i;
    if (auto* d = v.get_if<double>()) return std::isfinite(*d) ? json(*d) : json(ckpt::detail::double_text(*d));
    if (auto* b = v.get_if<bool>()) return *b;
    if (auto* s = v.get_if<std::string>()) return *s;
    if (auto* b = v.get_if<ckpt::Bytes>()) return {{"size", b->data.size()}, {"hex", hex_text(b->data)}};
    if (auto* list = v.get_if<ckpt::Strings>()) return *list;
    if (auto* o = v.get_if<ckpt::Object>()) return object_json(*o);
    return nullptr;
}

std::string kind_name(ckpt::ValueKind k) { return ckpt::detail::value_kind_name(k); }


bool is_temporary(const fs::path& p) { return ckpt::detail::temporary_owner(p.filename().string()).has_value(); }

// ---------------------------------------------------------------------------------------------
// Reading any of the formats: checkpoints, and by extension safetensors, npz and PyTorch files

enum class FileFormat { checkpoint, safetensors, npz, torch };

FileFormat format_of(const fs::path& p) {
    const auto ext = p.extension().string();
    if (ext == ".safetensors") return FileFormat::safetensors;
    if (ext == ".npz") return FileFormat::npz;
    if (ext == ".pt" || ext == ".pth") return FileFormat::torch;
    return FileFormat::checkpoint;
}

const char* format_name(FileFormat f) {
    switch (f) {
        case FileFormat::safetensors: return "safetensors";
        case FileFormat::npz: return "npz";
        case FileFormat::torch: return "PyTorch";
        case FileFormat::checkpoint: break;
    }
    return "checkpoint";
}

/// --key-file: the key of encrypted checkpoints, for every subcommand that reads bodies; and
/// --max-decoded-bytes, for every subcommand that reads files.
ckpt::LoadOptions load_options;
ckpt::InteropLoadOptions interop_options;

ckpt::ParamDict load_any(const fs::path& p) {
    switch (format_of(p)) {
        case FileFormat::safetensors: return ckpt::load_safetensors(p, interop_options);
        case FileFormat::npz: return ckpt::load_npz(p, interop_options);
        case FileFormat::torch: return ckpt::load_torch(p, interop_options);
        case FileFormat::checkpoint: break;
    }
    return ckpt::load_checkpoint(p, load_options);
}

/// --select REGEX and --rename FROM=TO (prefix mappings, the first that matches applies).
struct Selection {
    std::string select;
    std::vector<std::string> renames;

    ckpt::ParamDict apply(const ckpt::ParamDict& in) const {
        std::optional<std::regex> re;
        if (!select.empty()) {
            try {
                re.emplace(select);
            } catch (const std::regex_error& e) {
                throw UsageError("--select '" + select + "' is not a valid regular expression: " + e.what());
            }
        }
        std::vector<std::pair<std::string, std::string>> maps;
        for (const auto& r : renames) {
            const auto eq = r.find('=');
            if (eq == std::string::npos) throw UsageError("--rename '" + r + "' is not FROM=TO");
            maps.emplace_back(r.substr(0, eq), r.substr(eq + 1));
        }
        ckpt::ParamDict out;
        std::map<std::string, std::string> origin;
        for (const auto& [name, value] : in) {
            if (re && !std::regex_search(name, *re)) continue;
            std::string renamed = name;
            for (const auto& [from, to] : maps)
                if (name.starts_with(from)) {
                    renamed = to + name.substr(from.size());
                    break;
                }
            if (auto [it, fresh] = origin.emplace(renamed, name); !fresh)
                throw Failure("--rename maps both '" + it->second + "' and '" + name + "' to '" + renamed + "'");
            out.set(renamed, value);
        }
        return out;
    }
};

void refuse_overwrite(const fs::path& out, bool force) {
    if (!force && fs::exists(out)) throw Failure("'" + out.string() + "' exists; pass --force to replace it");
}

// ---------------------------------------------------------------------------------------------
// ls

struct Listed {
    fs::path path;
    std::string group;          // directory + prefix, or the last-words root
    std::string prefix, naming;
    ckpt::NameParts parts;
    bool named = false;         // its name carries run, epoch and step
    bool last_words = false;
    std::uint64_t size = 0;
    std::optional<ckpt::FileHeader> header;
    std::optional<std::string> problem;
    bool unsupported = false;  // the problem: perhaps whole, but unreadable here (latest() stops at it)
    bool latest = false;
    std::map<std::string, double> metrics;  // what the save recorded (Progress::metrics)
    bool best = false;
    std::optional<std::int64_t> index_step;  // a global index ("index-step_{g}.ckpt") of that step
};

/// A temporary a writer left (".{name}.tmp-{pid}-{n}"): killed mid-save, or still writing.
struct Temporary {
    fs::path path;
    long pid = 0;
    std::uint64_t size = 0;
    bool writer_running = false;
};

/// What `ckpt ls` says of a series besides its files: whether it finished, and who holds it.
struct SeriesState {
    std::optional<ckpt::FinishedRecord> finished;
    std::string held_by;  // the lock's holder, when the lock is held now
};

/// What `ckpt ls --best NAME[:max]` ranks by.
struct BestBy {
    std::string metric;
    ckpt::Mode mode = ckpt::Mode::min;
};

/// The names a checkpoint file could follow, tried with the base prefix its name suggests
/// ("lenet_1-7_1875.ckpt": run 1 of "lenet") or the one given.
bool classify(Listed& f, const std::string& name, const std::optional<std::string>& only_prefix) {
    std::vector<std::string> bases;
    if (only_prefix) {
        bases.push_back(*only_prefix);
    } else {
        const auto dash = name.rfind('-');
        if (dash == std::string::npos || dash == 0) return false;
        const std::string run_prefix = name.substr(0, dash);
        if (const auto us = run_prefix.rfind('_'); us != std::string::npos && us > 0) {
            const auto run = ckpt::detail::parse_count(std::string_view(run_prefix).substr(us + 1));
            if (run && *run > 0) bases.push_back(run_prefix.substr(0, us));
        }
        bases.push_back(run_prefix);
    }
    for (const auto& base : bases) {
        if (auto p = ckpt::MindSporeNaming{}.parse(base, name)) {
            f.parts = *p, f.prefix = base, f.naming = "MindSporeNaming";
            return true;
        }
        if (auto p = ckpt::StepNaming{}.parse(base, name)) {
            f.parts = *p, f.prefix = base, f.naming = "StepNaming";
            return true;
        }
    }
    return false;
}

std::vector<Listed> find_checkpoints(const fs::path& dir, const std::optional<std::string>& only_prefix,
                                     std::vector<Temporary>* temporaries = nullptr) {
    if (!fs::is_directory(dir)) throw Failure("'" + dir.string() + "' is not a directory");
    std::vector<Listed> out;
    boost::system::error_code ec;
    // files that vanish while the directory is read (a running job's) do not end the listing
    std::vector<std::pair<fs::path, fs::file_status>> entries;
    try {
        ckpt::detail::visit_entries(dir, 5, [&](const fs::path& p, const fs::file_status& s) { entries.emplace_back(p, s); });
    } catch (const ckpt::IoError& e) {
        throw Failure(e.what());
    }
    for (const auto& [p, status] : entries) {
        if (!fs::is_regular_file(status)) continue;
        if (const auto pid = ckpt::detail::temporary_owner(p.filename().string())) {
            const bool running = ::kill(static_cast<pid_t>(*pid), 0) == 0 || errno != ESRCH;
            if (temporaries) temporaries->push_back({p, *pid, fs::file_size(p, ec), running});
            continue;
        }
        if (p.extension() != ".ckpt") continue;
        Listed f;
        f.path = p;
        f.size = fs::file_size(p, ec);
        if ((f.index_step = ckpt::global_index_step(p.filename().string()))) {
            if (only_prefix) continue;
            f.group = p.parent_path().string();
            out.push_back(std::move(f));
            continue;
        }
        const std::string rel = p.lexically_relative(dir).generic_string();
        const auto lw = rel.find("tft_saved_checkpoints-step_");
        if (lw != std::string::npos && (lw == 0 || rel[lw - 1] == '/')) {
            if (auto parts = ckpt::LastWordsNaming{}.parse("", rel.substr(lw))) {
                if (only_prefix) continue;
                f.parts = *parts;
                f.named = f.last_words = true;
                f.naming = "LastWordsNaming";
                const std::string root = rel.substr(0, lw == 0 ? 0 : lw - 1);  // without its '/'
                f.group = (root.empty() ? dir : dir / root).string();
                out.push_back(std::move(f));
                continue;
            }
        }
        f.named = classify(f, p.filename().string(), only_prefix);
        if (!f.named && only_prefix) continue;
        f.group = p.parent_path().string() + (f.named ? " prefix '" + f.prefix + "'" : "");
        out.push_back(std::move(f));
    }
    return out;
}

/// A file whose owner record names another prefix or run than its name suggests is that
/// owner's (names alone never decide; see ckpt::CheckpointOwner): listed under the prefix it
/// records, or marked when its name does not follow that prefix at all (renamed by hand).
void take_recorded_owner(Listed& f) {
    if (!f.named || f.last_words || f.header->encoded()) return;  // an encoded body is not read here
    std::optional<ckpt::CheckpointOwner> owner;
    try {
        owner = ckpt::read_owner(f.path);
    } catch (const ckpt::Error&) {
        return;  // verification says what is wrong with it
    }
    // judged as latest() judges it (a record without a run names no other run)
    if (!ckpt::detail::foreign_owner(owner, f.prefix, f.parts)) return;
    const std::string name = f.path.filename().string();
    Listed again = f;
    if (classify(again, name, owner->prefix) && again.parts.run_prefix == owner->run_prefix) {
        again.group = f.path.parent_path().string() + " prefix '" + again.prefix + "'";
        f = std::move(again);
        return;
    }
    f.problem = "named as run '" + f.parts.run_prefix + "' of prefix '" + f.prefix + "' but it records prefix '" +
                owner->prefix + "' (run '" + owner->run_prefix + "'): not that prefix's checkpoint";
}

void check(Listed& f, bool headers_only) {
    try {
        f.header = ckpt::read_header(f.path);
    } catch (const ckpt::Error& e) {
        f.problem = e.what();
        f.unsupported = ckpt::detail::unsupported_here(e);
        return;
    }
    if (f.index_step) {  // an index whose files retention deleted is broken, whatever its checksum says
        if (headers_only) return;
        if (auto issue = ckpt::detail::global_index_issue(f.path)) f.problem = "global index of step " +
                                                                              std::to_string(*f.index_step) + ": " + issue->why;
        return;
    }
    take_recorded_owner(f);
    // An encrypted body is decoded only with a key (ckpt show --key-file); a compressed one is
    // decoded whole for its metrics, unless only headers were asked for.
    if (!f.header->encrypted() && !(f.header->encoded() && headers_only)) {
        try {
            f.metrics = ckpt::detail::recorded_metrics(ckpt::read_contents(f.path, load_options).entries);
        } catch (const ckpt::Error&) {
            // verification says what is wrong with it
        }
    }
    if (headers_only || f.problem) return;
    if (f.named) {
        ckpt::StoredCheckpoint stored{f.path, f.parts, {}};
        if (auto issue = ckpt::detail::checkpoint_issue(stored)) {
            f.problem = issue->why;
            f.unsupported = issue->unsupported;
        }
    } else {
        try {
            ckpt::verify_checkpoint(f.path);
        } catch (const ckpt::Error& e) {
            f.problem = e.what();
        }
    }
}

/// Orders like latest(): by run, global step, epoch and step; marks what latest() would pick
/// (the newest regular file that verifies, none when a newer one is unreadable here, where
/// latest() stops) and, for last words, the newest step whose files all verify.
void order_and_mark(std::vector<Listed>& files) {
    std::stable_sort(files.begin(), files.end(), [](const Listed& a, const Listed& b) {
        if (a.group != b.group) return a.group < b.group;
        if (!a.named || !b.named) {
            const auto pos = [](const Listed& f) {
                return f.header ? std::pair{f.header->epoch, f.header->step} : std::pair<std::int64_t, std::int64_t>{-1, -1};
            };
            return std::tuple(a.named, pos(a), a.path.string()) < std::tuple(b.named, pos(b), b.path.string());
        }
        return std::tie(a.parts.run, a.parts.global_step, a.parts.epoch, a.parts.step, a.parts.rank) <
               std::tie(b.parts.run, b.parts.global_step, b.parts.epoch, b.parts.step, b.parts.rank);
    });
    for (std::size_t end = files.size(); end > 0;) {
        std::size_t begin = end;
        while (begin > 0 && files[begin - 1].group == files[end - 1].group) --begin;
        if (files[end - 1].last_words) {
            for (std::size_t i = end; i > begin;) {
                const auto step = files[i - 1].parts.global_step;
                std::size_t j = i;
                bool whole = true;
                while (j > begin && files[j - 1].parts.global_step == step) whole &= !files[--j].problem;
                if (whole) {
                    for (std::size_t k = j; k < i; ++k) files[k].latest = true;
                    break;
                }
                i = j;
            }
        } else if (files[end - 1].named) {
            for (std::size_t i = end; i > begin; --i) {
                const Listed& f = files[i - 1];
                if (f.parts.kind != ckpt::SaveKind::regular) continue;
                if (!f.problem) {
                    files[i - 1].latest = true;
                    break;
                }
                if (f.unsupported) break;
            }
        }
        end = begin;
    }
}

/// Marks, in each group, the file best() would pick: the best value of the metric among the
/// files that verify (the newer of equals), as KeepBest ranks them.
void mark_best(std::vector<Listed>& files, const BestBy& by) {
    const ckpt::KeepBest rank(1, by.metric, by.mode);
    std::map<std::string, std::size_t> best;  // group -> index
    for (std::size_t i = 0; i < files.size(); ++i) {
        if (files[i].problem || !files[i].named) continue;
        const auto it = files[i].metrics.find(by.metric);
        if (it == files[i].metrics.end() || !std::isfinite(it->second)) continue;
        const auto b = best.find(files[i].group);
        if (b == best.end() || rank.better(it->second, i, files[b->second].metrics.at(by.metric), b->second))
            best[files[i].group] = i;
    }
    for (const auto& [group, i] : best) files[i].best = true;
    if (best.empty() && !files.empty()) {  // never recorded, or misspelled: say what there is
        std::set<std::string> recorded;
        for (const auto& f : files)
            for (const auto& [name, value] : f.metrics) recorded.insert(name);
        std::string names;
        for (const auto& name : recorded) names += (names.empty() ? "'" : ", '") + shown(name) + "'";
        std::cerr << "no checkpoint here that verifies records the metric '" << shown(by.metric) << "'"
                  << (names.empty() ? std::string(": none records a metric") : "; recorded: " + names) << "\n";
    }
}

/// "val_loss" (smaller is better) or "accuracy:max".
BestBy parse_best(const std::string& spec) {
    BestBy by;
    by.metric = spec;
    if (const auto colon = spec.rfind(':'); colon != std::string::npos) {
        const std::string mode = spec.substr(colon + 1);
        if (mode != "min" && mode != "max")
            throw UsageError("--best '" + spec + "': the mode after ':' is min or max, not '" + mode + "'");
        by.metric = spec.substr(0, colon);
        by.mode = mode == "max" ? ckpt::Mode::max : ckpt::Mode::min;
    }
    if (by.metric.empty()) throw UsageError("--best needs the name of a metric, as in --best val_loss or --best accuracy:max");
    return by;
}

/// "val_loss=0.2 accuracy=0.93": a file's recorded metrics.
std::string metrics_text(const std::map<std::string, double>& metrics) {
    std::string out;
    for (const auto& [name, value] : metrics) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", value);
        out += (out.empty() ? "" : " ") + shown(name) + "=" + buf;
    }
    return out;
}

/// A named file's epoch and step: from its name, or, for names that carry only the global step
/// (StepNaming), from its header when it reads.
std::pair<std::int64_t, std::int64_t> position_of(const Listed& f) {
    if (!f.parts.epoch_in_name && !f.last_words && f.header) return {f.header->epoch, f.header->step};
    return {f.parts.epoch, f.parts.step};
}

void print_temporaries(const std::vector<Temporary>& temporaries) {
    if (temporaries.empty()) return;
    std::cout << "\ntemporaries (each a save that did not finish, or a file retention deleted that its manager had not "
                 "freed yet; 'ckpt ls --clean' removes those whose writer is gone):\n";
    for (const auto& t : temporaries)
        std::cout << "  " << shown(t.path) << "  " << human_size(t.size) << "  pid " << t.pid << " "
                  << (t.writer_running ? "running" : "gone")
                  << (ckpt::detail::is_deleted_temporary(t.path.filename().string()) ? "  (deleted by retention)" : "")
                  << "\n";
}

/// Whether `prefix` in `dir` finished, and who holds its lock now: a shared lock taken for a
/// moment (a writer starting then asks again), refused while a writer holds it.
SeriesState series_state(const fs::path& dir, const std::string& prefix) {
    SeriesState state;
    state.finished = ckpt::read_finished(dir, prefix);
    const std::string lock = (dir / ckpt::detail::lock_file_name(prefix)).string();
    const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return state;
    const ckpt::detail::Fd owned(fd);
    if (::flock(fd, LOCK_SH | LOCK_NB) == 0) {
        ::flock(fd, LOCK_UN);
        return state;
    }
    if (errno == EWOULDBLOCK) {
        state.held_by = ckpt::detail::holder_text(ckpt::detail::parse_series_lines(ckpt::detail::read_head(fd)));
        if (state.held_by.empty()) state.held_by = "a writer that has not said who it is yet";
    }
    return state;
}

/// Removes the temporaries whose writer is gone (on this host); returns how many.
std::size_t clean_temporaries(std::vector<Temporary>& temporaries) {
    std::size_t removed = 0;
    for (auto it = temporaries.begin(); it != temporaries.end();) {
        if (!it->writer_running && ::unlink(it->path.c_str()) == 0) {
            std::cout << "removed " << shown(it->path) << " (left by process " << it->pid << ", gone)\n";
            ++removed;
            it = temporaries.erase(it);
        } else {
            ++it;
        }
    }
    return removed;
}

int cmd_ls(const fs::path& dir, const std::optional<std::string>& prefix, bool headers_only, bool as_json,
           const std::optional<BestBy>& best_by, bool clean) {
    if (best_by && headers_only) throw UsageError("--best needs the files verified: it cannot go with --headers-only");
    if (clean && as_json) throw UsageError("--clean reports what it removes as text: it cannot go with --json");
    std::vector<Temporary> temporaries;
    auto files = find_checkpoints(dir, prefix, &temporaries);
    if (prefix)  // the temporaries of this prefix's files: ".{prefix}-…" or a later run's ".{prefix}_{N}-…"
        std::erase_if(temporaries, [&](const Temporary& t) {
            const std::string name = t.path.filename().string();
            const std::string head = "." + *prefix;
            if (!name.starts_with(head)) return true;
            std::size_t at = head.size();
            if (at < name.size() && name[at] == '_') {
                const std::size_t digits = name.find_first_not_of("0123456789", at + 1);
                if (digits == at + 1 || digits == std::string::npos) return true;
                at = digits;
            }
            return at >= name.size() || name[at] != '-';
        });
    std::sort(temporaries.begin(), temporaries.end(), [](const Temporary& a, const Temporary& b) { return a.path < b.path; });
    if (clean) clean_temporaries(temporaries);
    for (auto& f : files) check(f, headers_only);
    order_and_mark(files);
    if (best_by) mark_best(files, *best_by);
    // the series the groups are: whether each finished, who holds it
    std::map<std::string, SeriesState> series;
    for (const auto& f : files)
        if (f.named && !f.last_words && !series.contains(f.group)) series[f.group] = series_state(f.path.parent_path(), f.prefix);
    if (as_json) {
        json groups = json::array();
        for (const auto& f : files) {
            if (groups.empty() || groups.back()["group"] != f.group) {
                groups.push_back({{"group", f.group}, {"prefix", f.prefix}, {"naming", f.naming}, {"checkpoints", json::array()}});
                if (const auto it = series.find(f.group); it != series.end()) {
                    const auto& r = it->second.finished;
                    groups.back()["finished"] = r ? json{{"file", r->file}, {"epoch", r->epoch}, {"step", r->step},
                                                         {"global_step", r->global_step}, {"arguments", r->arguments},
                                                         {"time", r->finished}}
                                                  : json(nullptr);
                    groups.back()["held_by"] = it->second.held_by.empty() ? json(nullptr) : json(it->second.held_by);
                }
            }
            json c = {{"path", f.path.string()}, {"size", f.size}};
            if (f.index_step) {
                c["kind"] = "global_index";
                c["global_step"] = *f.index_step;
            }
            if (f.named) {
                const auto [epoch, step] = position_of(f);
                c["run"] = f.parts.run;
                c["epoch"] = epoch;
                c["step"] = step;
                if (f.parts.global_step >= 0) c["global_step"] = f.parts.global_step;
                if (f.parts.rank >= 0) c["rank"] = f.parts.rank;
                c["kind"] = f.last_words ? "last_words" : f.parts.kind == ckpt::SaveKind::breakpoint ? "breakpoint" : "regular";
            }
            if (f.header) c["save_time"] = utc_time(f.header->save_time_ns);
            c["valid"] = headers_only ? json(nullptr) : json(!f.problem);
            if (f.problem) c["problem"] = *f.problem;
            c["latest"] = f.latest;
            if (!f.metrics.empty()) c["metrics"] = f.metrics;
            if (best_by) c["best"] = f.best;
            groups.back()["checkpoints"].push_back(std::move(c));
        }
        json temps = json::array();
        for (const auto& t : temporaries)
            temps.push_back({{"path", t.path.string()}, {"pid", t.pid}, {"size", t.size},
                             {"writer", t.writer_running ? "running" : "gone"},
                             {"deleted_by_retention", ckpt::detail::is_deleted_temporary(t.path.filename().string())}});
        std::cout << json_text(json{{"directory", dir.string()}, {"checkpoints", groups}, {"temporaries", temps}}) << "\n";
        return 0;
    }
    if (files.empty()) {
        std::cout << "no checkpoints in '" << shown(dir) << "'" << (prefix ? " with prefix '" + shown(*prefix) + "'" : "") << "\n";
        print_temporaries(temporaries);
        return 0;
    }
    std::string group;
    for (const auto& f : files) {
        if (f.group != group) {
            group = f.group;
            std::cout << (&f == &files.front() ? "" : "\n") << shown(f.group)
                      << (f.naming.empty() ? "" : " (" + f.naming + ")") << "\n";
            if (const auto it = series.find(f.group); it != series.end()) {
                if (const auto& r = it->second.finished)
                    std::cout << "  finished at '" << shown(r->file) << "': epoch " << r->epoch << ", step " << r->step
                              << " (global step " << r->global_step << ")"
                              << (r->arguments.empty() ? "" : " with '" + shown(r->arguments) + "'") << ", "
                              << ckpt::detail::readable_time(r->finished) << "\n";
                if (!it->second.held_by.empty()) std::cout << "  being written by " << shown(it->second.held_by) << "\n";
            }
            std::printf("  %-44s %4s %6s %8s %-10s %10s  %-20s %s\n", "FILE", "RUN", "EPOCH", "STEP", "KIND", "SIZE",
                        "SAVED", "STATUS");
        }
        const std::string name =
            shown(f.path.lexically_relative(f.last_words ? fs::path(f.group) : f.path.parent_path()).generic_string());
        const std::string status = f.problem ? "INVALID: " + shown(*f.problem) : headers_only ? "header ok" : "ok";
        std::string run = "-", epoch = "-", step = "-", kind = "-";
        if (f.named) {
            const auto [e, st] = position_of(f);
            run = std::to_string(f.parts.run);
            epoch = std::to_string(e);
            step = std::to_string(st);
            kind = f.last_words ? "last words" : f.parts.kind == ckpt::SaveKind::breakpoint ? "breakpoint" : "regular";
        } else if (f.index_step) {
            step = std::to_string(*f.index_step);
            kind = "index";
        } else if (f.header) {
            epoch = std::to_string(f.header->epoch);
            step = std::to_string(f.header->step);
        }
        std::string marks = f.latest ? (f.last_words ? "  <- latest last words" : "  <- latest") : "";
        if (f.best) marks += "  <- best " + shown(best_by->metric);
        const std::string metrics = f.metrics.empty() ? "" : "  " + metrics_text(f.metrics);
        std::printf("  %-44s %4s %6s %8s %-10s %10s  %-20s %s%s%s\n", name.c_str(), run.c_str(), epoch.c_str(),
                    step.c_str(), kind.c_str(), human_size(f.size).c_str(),
                    f.header ? utc_time(f.header->save_time_ns).c_str() : "-", status.c_str(), metrics.c_str(),
                    marks.c_str());
    }
    print_temporaries(temporaries);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// plot

/// One checkpoint that `ckpt plot` draws: its place on the x axis, its run and its values.
struct PlotPoint {
    const Listed* file = nullptr;
    double x = 0;
    std::string run;
    bool restart = false;                       // the first of a run after the first
    std::vector<std::optional<double>> values;  // one per metric asked for
};

/// A checkpoint's global step when it is known: from a name that carries it (StepNaming, last
/// words) or, in the first epoch, the step (the steps of the first epoch are global steps).
std::optional<std::int64_t> known_global_step(const Listed& f) {
    if (f.named && f.parts.global_step >= 0) return f.parts.global_step;
    if (f.header->epoch <= 1 && f.header->step > 0) return f.header->step;
    return std::nullopt;
}

/// Places the points: at their global step when every one has one; otherwise at their epoch,
/// a save within an epoch at (epoch - 1) + step / the most steps any of them records, so that
/// a save at the end of epoch e is at e. Returns the axis's name.
std::string place_points(std::vector<PlotPoint>& points) {
    bool all_global = true;
    for (const auto& p : points) all_global &= known_global_step(*p.file).has_value();
    if (all_global) {
        for (auto& p : points) p.x = static_cast<double>(*known_global_step(*p.file));
        return "step";
    }
    std::int64_t most = 0;
    for (const auto& p : points) most = std::max(most, p.file->header->step);
    for (auto& p : points) {
        const auto& h = *p.file->header;
        p.x = most > 0 && h.step > 0 ? static_cast<double>(h.epoch - 1) + static_cast<double>(h.step) / static_cast<double>(most)
                                     : static_cast<double>(h.epoch);
    }
    return "epoch";
}

std::string number_text(double v, int digits) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    return buf;
}

/// A string in gnuplot's single quotes, where nothing is escaped but the quote (doubled).
std::string gnuplot_quoted(const std::string& s) {
    std::string out = "'";
    for (const char c : s) out += c == '\'' ? std::string("''") : c == '\n' || c == '\r' ? std::string(" ") : std::string(1, c);
    return out + "'";
}

/// A file of our own in the temporary directory, removed when it goes.
struct ScratchFile {
    std::string path;
    explicit ScratchFile(const std::string& what) {
        path = (fs::temp_directory_path() / ("ckpt-plot-" + what + "-XXXXXX")).string();
        const int fd = ::mkstemp(path.data());
        if (fd < 0) throw Failure("cannot create a temporary file '" + path + "': " + std::strerror(errno));
        ::close(fd);
    }
    ScratchFile(const ScratchFile&) = delete;
    ScratchFile& operator=(const ScratchFile&) = delete;
    ~ScratchFile() { ::unlink(path.c_str()); }
};

/// Runs `gnuplot SCRIPT` and waits for it at most `timeout`: past that it is killed. Fails with
/// a message that starts with `what` when gnuplot is missing, fails, or is killed.
void run_gnuplot(const std::string& script, const std::string& what, std::chrono::seconds timeout) {
    ScratchFile errors("stderr");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);  // our stdout is the table
    posix_spawn_file_actions_addopen(&actions, 2, errors.path.c_str(), O_WRONLY | O_TRUNC, 0);
    std::string program = "gnuplot", script_arg = script;
    char* argv[] = {program.data(), script_arg.data(), nullptr};
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc == ENOENT) throw Failure(what + ": gnuplot not found: apt-get install gnuplot-nox");
    if (rc != 0) throw Failure(what + ": cannot start gnuplot: " + std::strerror(rc));

    // Polls, so that the wait has an end whatever gnuplot does.
    const auto wait_until = [pid](std::chrono::steady_clock::time_point deadline, int& status) {
        for (;;) {
            const pid_t r = ::waitpid(pid, &status, WNOHANG);
            if (r == pid) return true;
            if (r < 0 && errno != EINTR) return true;  // not ours to wait for any more
            if (std::chrono::steady_clock::now() >= deadline) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    };
    int status = 0;
    if (!wait_until(std::chrono::steady_clock::now() + timeout, status)) {
        ::kill(pid, SIGKILL);
        const bool gone = wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(5), status);
        throw Failure(what + ": gnuplot did not finish within " + std::to_string(timeout.count()) + " s (--timeout): " +
                      (gone ? "killed it" : "killed it, but process " + std::to_string(pid) + " has not exited"));
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    std::ifstream in(errors.path);
    std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!said.empty() && std::isspace(static_cast<unsigned char>(said.back()))) said.pop_back();
    if (said.size() > 2000) said = "..." + said.substr(said.size() - 2000);
    throw Failure(what + ": gnuplot failed (" +
                  (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                     : "signal " + std::to_string(WTERMSIG(status))) +
                  ")" + (said.empty() ? std::string() : ":\n" + said));
}

/// The gnuplot script drawing `points`: one line-and-points series per metric, the line broken
/// where a run ends, and a dashed vertical line at the first point of every later run.
std::string plot_script(const std::vector<PlotPoint>& points, const std::vector<std::string>& metrics,
                        const std::string& title, const std::string& axis, const std::string& png) {
    std::ostringstream s;
    s << "set terminal pngcairo noenhanced size 1000,600 font 'sans,11'\n"
      << "set output " << gnuplot_quoted(png) << "\n"
      << "set title " << gnuplot_quoted(title) << "\n"
      << "set xlabel " << gnuplot_quoted(axis == "step" ? "global step" : "epoch") << "\n"
      << "set ylabel " << gnuplot_quoted(metrics.size() == 1 ? metrics.front() : "value") << "\n"
      << "set grid\nset key outside right top\n"
      << "set offsets graph 0.02, graph 0.02, graph 0.05, graph 0.05\n"
      << "set datafile missing '-'\n";
    // Steps and epochs are whole numbers: over a short range, a tic at each rather than at halves.
    const auto [lo, hi] = std::minmax_element(points.begin(), points.end(),
                                              [](const PlotPoint& a, const PlotPoint& b) { return a.x < b.x; });
    if (hi->x - lo->x <= 10) s << "set xtics 1\n";
    if (hi->x == lo->x) s << "set xrange [" << number_text(lo->x - 1, 17) << ":" << number_text(lo->x + 1, 17) << "]\n";
    // The data, inline: a blank line between runs breaks the series' line there.
    s << "$points << EOD\n";
    for (const auto& p : points) {
        if (p.restart) s << "\n";
        s << number_text(p.x, 17);
        for (const auto& v : p.values) s << " " << (v ? number_text(*v, 17) : "-");
        s << "\n";
    }
    s << "EOD\n";
    for (const auto& p : points) {
        if (!p.restart) continue;
        const std::string x = number_text(p.x, 17);
        s << "set arrow from " << x << ", graph 0 to " << x << ", graph 1 nohead dashtype 2 linewidth 1.5 "
          << "linecolor rgb 'gray40' back\n"
          << "set label 'restart' at " << x << ", graph 1 rotate by 90 right offset character 1.2, character -0.5 "
          << "textcolor rgb 'gray40'\n";
    }
    s << "plot ";
    for (std::size_t i = 0; i < metrics.size(); ++i)
        s << (i ? ", \\\n     " : "") << "$points using 1:" << i + 2 << " with linespoints linewidth 2 pointtype 7 "
          << "pointsize 1.2 title " << gnuplot_quoted(metrics[i]);
    s << "\n";
    return s.str();
}

/// The points as a table on stdout: x, run, one column per metric, and the file.
void print_points(const std::vector<PlotPoint>& points, const std::vector<std::string>& metrics, const std::string& axis,
                  const fs::path& dir) {
    std::size_t run_width = 3;
    for (const auto& p : points) run_width = std::max(run_width, shown(p.run).size());
    std::string axis_name = axis;
    std::transform(axis_name.begin(), axis_name.end(), axis_name.begin(), [](unsigned char c) { return std::toupper(c); });
    std::printf("  %10s  %-*s", axis_name.c_str(), static_cast<int>(run_width), "RUN");
    for (const auto& m : metrics) std::printf("  %12s", shown(m).c_str());
    std::printf("  FILE\n");
    for (const auto& p : points) {
        const std::string x = number_text(p.x, axis == "step" ? 17 : 6);
        const std::string run = shown(p.run);
        if (p.restart) std::printf("  restart at %s %s: run '%s'\n", axis.c_str(), x.c_str(), run.c_str());
        std::printf("  %10s  %-*s", x.c_str(), static_cast<int>(run_width), run.c_str());
        for (std::size_t i = 0; i < metrics.size(); ++i)
            std::printf("  %*s", static_cast<int>(std::max<std::size_t>(12, shown(metrics[i]).size())),
                        p.values[i] ? number_text(*p.values[i], 6).c_str() : "-");
        std::printf("  %s\n", shown(p.file->path.lexically_relative(dir).generic_string()).c_str());
    }
}

int cmd_plot(const fs::path& dir, const std::optional<std::string>& prefix, const std::vector<std::string>& metrics,
             const fs::path& out, bool force, std::chrono::seconds timeout) {
    std::set<std::string> seen;
    for (const auto& m : metrics) {
        if (m.empty()) throw UsageError("--metric needs the name of a metric, as in --metric val_loss");
        if (!seen.insert(m).second) throw UsageError("--metric '" + m + "' is given twice");
    }
    if (out.extension() != ".png") throw UsageError("the output '" + out.string() + "' must end in .png");
    if (out.string().find_first_of("\n\r") != std::string::npos)
        throw UsageError("the output file's name must not contain a line break");
    refuse_overwrite(out, force);

    std::string names;
    for (const auto& m : metrics) names += (names.empty() ? "'" : ", '") + m + "'";
    const std::string where = "'" + dir.string() + "'" + (prefix ? " (prefix '" + *prefix + "')" : "");
    const std::string what = "cannot plot " + names + " of " + where;

    // The checkpoints as ckpt ls finds, verifies and orders them.
    auto files = find_checkpoints(dir, prefix);
    for (auto& f : files) check(f, false);
    order_and_mark(files);
    std::size_t skipped = 0;
    std::vector<const Listed*> recording;  // those that verify and record one of the metrics
    for (const auto& f : files) {
        if (f.problem) {
            std::cerr << "ckpt plot: skipped '" << shown(f.path) << "': " << shown(*f.problem) << "\n";
            ++skipped;
        } else if (f.header->encoded()) {
            std::cerr << "ckpt plot: skipped '" << shown(f.path) << "': its body is stored through "
                      << f.header->codec_names() << ", whose recorded metrics are not read\n";
            ++skipped;
        } else if (std::any_of(metrics.begin(), metrics.end(), [&](const auto& m) { return f.metrics.contains(m); })) {
            recording.push_back(&f);
        }
    }
    for (const auto& m : metrics) {
        if (std::any_of(recording.begin(), recording.end(), [&](const Listed* f) { return f->metrics.contains(m); }))
            continue;
        std::set<std::string> recorded;  // what they do record, to say
        for (const auto& f : files)
            if (!f.problem)
                for (const auto& [name, value] : f.metrics) recorded.insert(name);
        std::string others;
        for (const auto& r : recorded) others += (others.empty() ? "" : ", ") + r;
        throw Failure("no checkpoint under " + where + (skipped ? " that verifies" : "") + " records metric '" + m +
                      "'" + (skipped ? " (" + std::to_string(skipped) + " skipped)" : "") +
                      (files.empty()      ? ": there are no checkpoints"
                       : recorded.empty() ? ": they record no metrics"
                                          : ": they record " + others));
    }
    std::vector<std::string> groups;  // in order: ordered by group first
    for (const Listed* f : recording)
        if (groups.empty() || groups.back() != f->group) groups.push_back(f->group);
    if (groups.size() > 1) {
        std::string list;
        for (const auto& g : groups) list += "\n  " + shown(g);
        throw UsageError("checkpoints of more than one prefix or directory under '" + dir.string() + "' record " + names +
                         ":" + list + "\nchoose one with --prefix, or give its directory as DIR");
    }

    std::vector<PlotPoint> points;
    for (const Listed* f : recording) {
        // Last words: one point per step, the lowest rank's (the ranks are ordered within a step).
        if (f->last_words && !points.empty() && points.back().file->parts.global_step == f->parts.global_step) continue;
        PlotPoint p;
        p.file = f;
        p.run = f->named && !f->last_words ? f->parts.run_prefix : "-";
        p.restart = !points.empty() && points.back().run != p.run;
        for (const auto& m : metrics) {
            const auto it = f->metrics.find(m);
            p.values.push_back(it == f->metrics.end() ? std::nullopt : std::optional(it->second));
        }
        points.push_back(std::move(p));
    }
    const std::string axis = place_points(points);
    const std::size_t restarts = std::count_if(points.begin(), points.end(), [](const PlotPoint& p) { return p.restart; });

    const Listed& first = *points.front().file;
    ckpt::detail::AtomicFile png(out, force);  // a temporary next to it, renamed over it once drawn
    ScratchFile script("script");
    {
        std::ofstream s(script.path, std::ios::trunc);
        s << plot_script(points, metrics, first.group, axis, png.temp_path());
        if (!s.flush()) throw Failure(what + ": cannot write the gnuplot script '" + script.path + "'");
    }
    run_gnuplot(script.path, what, timeout);
    png.reopen_replaced();  // gnuplot wrote it; make what it wrote durable
    if (fs::file_size(png.temp_path()) == 0) throw Failure(what + ": gnuplot wrote an empty image");
    png.commit();

    std::cout << shown(first.group) << (first.naming.empty() ? "" : " (" + first.naming + ")") << ": " << points.size()
              << " checkpoint" << (points.size() == 1 ? "" : "s") << ", x axis "
              << (axis == "step" ? "global step" : "epoch") << "\n";
    print_points(points, metrics, axis, dir);
    std::cout << "wrote " << shown(out) << " (" << human_size(fs::file_size(out)) << "): " << metrics.size()
              << " series, " << points.size() << " point" << (points.size() == 1 ? "" : "s") << ", " << restarts << " restart" << (restarts == 1 ? "" : "s")
              << "\n";
    return 0;
}

// ---------------------------------------------------------------------------------------------
// show

/// The numbers of a tensor, as doubles: its elements, or a complex tensor's real and imaginary
/// parts in turn (statistics and comparisons take both parts as numbers).
std::size_t components(const ckpt::Tensor& t) {
    return t.nbytes() / ckpt::number_size(t.dtype());
}

template <class T>
double number_at(const ckpt::Tensor& t, std::size_t i) {
    T v;
    std::memcpy(&v, t.data() + i * sizeof(T), sizeof(T));
    if constexpr (std::is_class_v<T>) return static_cast<float>(v);  // float16, bfloat16, float8
    else return static_cast<double>(v);
}

/// Number i of a tensor (see components); chosen once per tensor, by dtype.
using NumberAt = double (*)(const ckpt::Tensor&, std::size_t);

NumberAt number_reader(ckpt::DType d) {
    switch (d) {
        case ckpt::DType::float32: return number_at<float>;
        case ckpt::DType::float64: return number_at<double>;
        case ckpt::DType::float16: return number_at<ckpt::float16>;
        case ckpt::DType::int32: return number_at<std::int32_t>;
        case ckpt::DType::int64: return number_at<std::int64_t>;
        case ckpt::DType::uint8: return number_at<std::uint8_t>;
        case ckpt::DType::boolean:  // by its byte: a file may hold others than 0 and 1
            return [](const ckpt::Tensor& t, std::size_t i) { return t.data()[i] != std::byte{0} ? 1.0 : 0.0; };
        case ckpt::DType::int8: return number_at<std::int8_t>;
        case ckpt::DType::int16: return number_at<std::int16_t>;
        case ckpt::DType::uint16: return number_at<std::uint16_t>;
        case ckpt::DType::uint32: return number_at<std::uint32_t>;
        case ckpt::DType::uint64: return number_at<std::uint64_t>;
        case ckpt::DType::bfloat16: return number_at<ckpt::bfloat16>;
        case ckpt::DType::float8_e4m3fn: return number_at<ckpt::float8_e4m3fn>;
        case ckpt::DType::float8_e5m2: return number_at<ckpt::float8_e5m2>;
        case ckpt::DType::complex64: return number_at<float>;
        case ckpt::DType::complex128: return number_at<double>;
    }
    return [](const ckpt::Tensor&, std::size_t) { return 0.0; };
}

/// One item of a value map as text: exact for integers and bools, shortest round-trip
/// decimal for floats, each part of a complex number, quoted strings.
json map_item_json(const ckpt::detail::MapItem& item) {
    using ckpt::DType;
    if (item.tag == ckpt::detail::MapTag::string) return item.bytes;
    const auto t = ckpt::Tensor::view(item.dtype, ckpt::Shape{static_cast<std::int64_t>(item.count())},
                                      const_cast<char*>(item.bytes.data()));
    const NumberAt number = number_reader(item.dtype);
    json values = json::array();
    for (std::size_t i = 0; i < components(t); ++i) {
        std::int64_t iv = 0;
        std::uint64_t uv = 0;
        switch (item.dtype) {
            case DType::int64: std::memcpy(&iv, item.bytes.data() + 8 * i, 8); values.push_back(iv); continue;
            case DType::uint64: std::memcpy(&uv, item.bytes.data() + 8 * i, 8); values.push_back(uv); continue;
            case DType::boolean: values.push_back(number(t, i) != 0); continue;
            default: break;
        }
        const double d = number(t, i);
        values.push_back(std::isfinite(d) ? json(d) : json(ckpt::detail::double_text(d)));
    }
    if (item.tag == ckpt::detail::MapTag::vector) return values;
    return values.size() == 1 ? values[0] : values;  // a complex number: [re, im]
}

json object_json(const ckpt::Object& o) {
    json j = {{"type", o.type}, {"encoding", ckpt::object_encoding_name(o.encoding)}, {"size", o.data.size()}};
    if (o.encoding == ckpt::ObjectEncoding::value_map) {
        try {
            json items = json::object();
            for (const auto& item : ckpt::detail::decode_value_map(o.data, "the map")) items[item.key] = map_item_json(item);
            j["items"] = std::move(items);
        } catch (const ckpt::FormatError& e) {
            j["problem"] = e.what();
        }
    } else if (o.encoding == ckpt::ObjectEncoding::boost_binary) {
        j["hex"] = hex_text(o.data);
    } else {
        j["text"] = o.data;
    }
    return j;
}

/// An object as `show` lists it: its type and size, a map's items, a text encoding's text.
std::string object_text(const ckpt::Object& o) {
    std::string out = o.type + ", " + std::string(ckpt::object_encoding_name(o.encoding)) + ", " +
                      std::to_string(o.data.size()) + " bytes";
    if (o.encoding == ckpt::ObjectEncoding::value_map) {
        std::vector<ckpt::detail::MapItem> map;
        try {
            map = ckpt::detail::decode_value_map(o.data, "the map");
        } catch (const ckpt::FormatError& e) {
            return out + ": " + e.what();
        }
        std::string items;
        for (const auto& item : map) {
            if (items.size() > 200) {
                items += ", …";
                break;
            }
            items += (items.empty() ? "" : ", ") + json_quoted(item.key) + ": " +
                     (item.tag == ckpt::detail::MapTag::string ? json_quoted(item.bytes) : map_item_json(item).dump());
        }
        return out + ": {" + items + "}";
    }
    if (o.encoding == ckpt::ObjectEncoding::boost_binary) return out;
    return out + ": " + shortened(json_quoted(o.data));
}

struct Stats {
    double min = 0, max = 0, mean = 0, std = 0;
    std::uint64_t nan = 0, inf = 0, finite = 0;
};

Stats tensor_stats(const ckpt::Tensor& t) {
    Stats s;
    double sum = 0, sum_sq = 0;
    bool first = true;
    auto add = [&](double v) {
        if (std::isnan(v)) return void(++s.nan);
        if (std::isinf(v)) return void(++s.inf);
        ++s.finite;
        if (first || v < s.min) s.min = v;
        if (first || v > s.max) s.max = v;
        first = false;
        sum += v;
        sum_sq += v * v;
    };
    const NumberAt number = number_reader(t.dtype());
    for (std::size_t i = 0, n = components(t); i < n; ++i) add(number(t, i));
    if (s.finite) {
        const auto n = static_cast<double>(s.finite);
        s.mean = sum / n;
        s.std = std::sqrt(std::max(0.0, sum_sq / n - s.mean * s.mean));
    }
    return s;
}

json entries_json(const std::vector<ckpt::EntryInfo>& list, const std::optional<ckpt::ParamDict>& loaded) {
    json entries = json::array();
    for (const auto& e : list) {
        json j = {{"name", e.name}, {"kind", kind_name(e.kind)}};
        if (e.kind == ckpt::ValueKind::tensor) {
            j["dtype"] = ckpt::dtype_name(e.dtype);
            j["shape"] = e.logical_shape();
            j["order"] = e.order == ckpt::Order::column_major ? "column_major" : "row_major";
            j["bytes"] = e.nbytes;
            if (loaded) {
                const auto s = tensor_stats(loaded->tensor(e.name));
                j["stats"] = {{"min", s.finite ? json(s.min) : json(nullptr)},
                              {"max", s.finite ? json(s.max) : json(nullptr)},
                              {"mean", s.finite ? json(s.mean) : json(nullptr)},
                              {"std", s.finite ? json(s.std) : json(nullptr)},
                              {"nan", s.nan},
                              {"inf", s.inf}};
            }
        } else {
            j["value"] = scalar_json(e.scalar);
        }
        entries.push_back(std::move(j));
    }
    return entries;
}

void print_entries(const std::vector<ckpt::EntryInfo>& entries, const std::optional<ckpt::ParamDict>& loaded,
                   bool stats) {
    std::cout << "  " << entries_count(entries.size()) << "\n\n";
    std::size_t width = 4;
    for (const auto& e : entries) width = std::max(width, shown(e.name).size());
    std::printf("  %-*s  %-7s  %-7s  %-16s %-12s %12s", static_cast<int>(width), "NAME", "KIND", "DTYPE", "SHAPE", "ORDER",
                "BYTES");
    std::printf(stats ? "  %12s %12s %12s %12s %5s %5s\n" : "  VALUE\n", "MIN", "MAX", "MEAN", "STD", "NAN", "INF");
    for (const auto& e : entries) {
        const bool tensor = e.kind == ckpt::ValueKind::tensor;
        std::printf("  %-*s  %-7s  %-7s  %-16s %-12s %12s", static_cast<int>(width), shown(e.name).c_str(),
                    tensor ? "tensor" : kind_name(e.kind).c_str(), tensor ? std::string(ckpt::dtype_name(e.dtype)).c_str() : "",
                    tensor ? ckpt::shape_string(e.logical_shape()).c_str() : "",
                    tensor ? std::string(ckpt::order_name(e.order)).c_str() : "", tensor ? std::to_string(e.nbytes).c_str() : "");
        if (!tensor) {
            std::printf("  %s\n", scalar_text(e.scalar).c_str());
        } else if (loaded) {
            const auto s = tensor_stats(loaded->tensor(e.name));
            if (s.finite)
                std::printf("  %12.6g %12.6g %12.6g %12.6g %5llu %5llu\n", s.min, s.max, s.mean, s.std,
                            static_cast<unsigned long long>(s.nan), static_cast<unsigned long long>(s.inf));
            else
                std::printf("  %12s %12s %12s %12s %5llu %5llu\n", "-", "-", "-", "-",
                            static_cast<unsigned long long>(s.nan), static_cast<unsigned long long>(s.inf));
        } else {
            std::printf("\n");
        }
    }
}

/// What `show` reads of a .safetensors, .npz, .pt or .pth file without --stats: what listing
/// needs, no tensor's bytes.
std::vector<ckpt::EntryInfo> contents_any(const fs::path& p) {
    switch (format_of(p)) {
        case FileFormat::safetensors: return ckpt::safetensors_contents(p, interop_options);
        case FileFormat::npz: return ckpt::npz_contents(p, interop_options);
        case FileFormat::torch: return ckpt::torch_contents(p, interop_options);
        case FileFormat::checkpoint: break;
    }
    return ckpt::read_contents(p, load_options).entries;
}

/// `show` of a .safetensors, .npz, .pt or .pth file: its entries, as `diff` and `import` read
/// them; without --stats, from the header, the zip directory and npy headers, or the pickle.
int cmd_show_dict(const fs::path& file, bool stats, bool as_json) {
    std::vector<ckpt::EntryInfo> entries;
    std::optional<ckpt::ParamDict> loaded;
    if (stats) {
        loaded = load_any(file);
        for (const auto& [name, value] : *loaded) entries.push_back(ckpt::detail::entry_of(name, value));
    } else {
        entries = contents_any(file);
    }
    const char* kind = format_name(format_of(file));
    if (as_json) {
        std::cout << json_text(json{{"path", file.string()}, {"format", kind}, {"entries", entries_json(entries, loaded)}})
                  << "\n";
        return 0;
    }
    static constexpr const char* read[] = {"header and table of contents", "header", "zip directory and npy headers",
                                           "zip directory and pickle"};
    std::cout << shown(file) << "\n  " << kind << " file"
              << (stats ? "" : std::string(" (") + read[static_cast<int>(format_of(file))] + " read; --stats reads the tensors)")
              << "\n";
    print_entries(entries, loaded, stats);
    return 0;
}

int cmd_show(const fs::path& file, bool stats, bool as_json) {
    if (format_of(file) != FileFormat::checkpoint) return cmd_show_dict(file, stats, as_json);
    ckpt::CheckpointContents contents;
    // Without a key, an encrypted file still shows its header; its entries are not readable.
    const bool locked = load_options.key.empty() && ckpt::read_header(file).encrypted();
    if (locked && stats)
        throw Failure("'" + file.string() + "' is encrypted: --stats needs its key (--key-file)");
    std::optional<ckpt::ParamDict> loaded;
    // --stats verifies the checksum first: damage is reported as the corruption it is, not as
    // whatever the table of contents then looks like
    if (stats && !locked) loaded = ckpt::load_checkpoint(file, load_options);
    if (locked) contents.header = ckpt::verify_checkpoint(file);
    else contents = ckpt::read_contents(file, load_options);
    const auto& h = contents.header;
    // The owner record is the manager's, not an entry of the program's: shown apart.
    const auto owner = ckpt::detail::owner_in(contents.entries);
    const auto share = ckpt::detail::share_in(contents.entries);
    std::erase_if(contents.entries, [](const ckpt::EntryInfo& e) { return ckpt::detail::is_reserved_name(e.name); });
    const bool verified = locked || loaded || h.encoded();  // a codec's body is read whole, so checked
    if (as_json) {
        const json entries = entries_json(contents.entries, loaded);
        json header = {{"format_version", h.version},
                       {"archive", ckpt::archive_kind_name(h.archive)},
                       {"codecs", h.codec_names()},
                       {"body_bytes", h.body_length},
                       {"epoch", h.epoch},
                       {"step", h.step},
                       {"save_time", utc_time(h.save_time_ns)},
                       {"checksum_xxh3", hex64(h.body_hash)}};
        json out = {{"path", file.string()}, {"header", header}, {"checksum_verified", verified}};
        if (owner) out["owner"] = {{"prefix", owner->prefix}, {"run", owner->run_prefix}};
        if (share) out["share"] = *share;
        if (locked) out["entries"] = nullptr;
        else out["entries"] = entries;
        std::cout << json_text(out) << "\n";
        return 0;
    }
    std::cout << shown(file) << "\n"
              << "  format version " << h.version << ", " << ckpt::archive_kind_name(h.archive) << " archive, body "
              << h.body_length << " bytes"
              << (h.encoded() ? " stored through " + h.codec_names() : std::string()) << "\n"
              << "  epoch " << h.epoch << ", step " << h.step << ", saved " << utc_time(h.save_time_ns) << "\n"
              << "  checksum xxh3 " << hex64(h.body_hash)
              << (verified ? " (verified)" : " (not read; ckpt verify or --stats checks it)") << "\n";
    if (owner) std::cout << "  written for prefix '" << shown(owner->prefix) << "', run '" << shown(owner->run_prefix) << "'\n";
    if (share) std::cout << "  " << shown(*share) << "\n";
    if (locked) {
        std::cout << "  entries encrypted: pass --key-file to list them\n";
        return 0;
    }
    print_entries(contents.entries, loaded, stats);
    return 0;
}

/// `show --entry`: one entry, read and verified alone (ckpt::open) where the file allows it,
/// with its statistics.
int cmd_show_entry(const fs::path& file, const std::string& name, bool as_json) {
    if (format_of(file) != FileFormat::checkpoint)
        throw Failure("--entry reads one entry of a checkpoint; '" + file.string() +
                      "' is not one (show --stats reads all of its entries)");
    const ckpt::CheckpointReader reader = ckpt::open(file, load_options);
    const std::vector<ckpt::EntryInfo> one{reader.entry(name)};
    std::optional<ckpt::ParamDict> loaded(std::in_place);
    loaded->set(one[0].name, reader.read(name));
    const auto& h = reader.header();
    const std::string how = reader.verifies_pieces()
                                ? "read and verified alone: " + std::to_string(reader.bytes_read()) + " of the " +
                                      std::to_string(h.body_length) + " body bytes"
                                : "the whole file was read and verified (format version " + std::to_string(h.version) +
                                      "; only version 3 files are read in parts)";
    if (as_json) {
        json out = {{"path", file.string()},
                    {"entry", entries_json(one, loaded)[0]},
                    {"verified_alone", reader.verifies_pieces()},
                    {"bytes_read", reader.verifies_pieces() ? reader.bytes_read() : h.body_length}};
        std::cout << json_text(out) << "\n";
        return 0;
    }
    std::cout << shown(file) << "\n  entry '" << shown(name) << "', " << how << "\n";
    print_entries(one, loaded, true);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// verify

int cmd_verify(const std::vector<fs::path>& paths) {
    int failed = 0, passed = 0;
    std::size_t temporaries = 0;
    for (const auto& target : paths) {
        std::vector<fs::path> files;
        if (fs::is_directory(target)) {
            boost::system::error_code ec;
            for (fs::recursive_directory_iterator it(target, ec), end; it != end; it.increment(ec)) {
                if (ec) throw Failure("cannot list '" + target.string() + "': " + ec.message());
                if (!fs::is_regular_file(it->status())) continue;
                if (is_temporary(it->path())) ++temporaries;
                else if (it->path().extension() == ".ckpt") files.push_back(it->path());
            }
            std::sort(files.begin(), files.end());
            if (files.empty()) {
                std::cout << "FAILED " << shown(target) << ": no checkpoint files (*.ckpt) in this directory\n";
                ++failed;
            }
        } else {
            files.push_back(target);
        }
        for (const auto& f : files) {
            try {
                const auto h = ckpt::verify_checkpoint(f);
                // a global index whose files retention deleted is broken, whatever its checksum says
                if (const auto step = ckpt::global_index_step(f.filename().string()))
                    if (auto issue = ckpt::detail::global_index_issue(f))
                        throw ckpt::FormatError("global index of step " + std::to_string(*step) + ": " + issue->why,
                                                f.string());
                // With the key, an encrypted body is also decrypted: that authenticates it.
                const bool authenticated = h.encrypted() && !load_options.key.empty();
                if (authenticated) ckpt::load_checkpoint(f, load_options);
                std::cout << "ok     " << shown(f) << " (epoch " << h.epoch << ", step " << h.step << ", "
                          << human_size(h.body_length + ckpt::header_size)
                          << (h.encoded() ? ", " + h.codec_names() : std::string())
                          << (authenticated ? ", authenticated" : "") << ")\n";
                ++passed;
            } catch (const ckpt::Error& e) {
                std::cout << "FAILED " << shown(f) << ": " << shown(e.what()) << "\n";
                ++failed;
            }
        }
    }
    std::cout << passed << " verified, " << failed << " failed\n";
    if (temporaries)
        std::cout << temporaries << " temporar" << (temporaries == 1 ? "y" : "ies")
                  << " of saves that did not finish (ckpt ls shows them, ckpt ls --clean removes those whose writer "
                     "is gone)\n";
    return failed ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// diff

/// Like numpy.allclose(a, b, rtol, atol, equal_nan=True): |a - b| <= atol + rtol * |b|.
struct Closeness {
    double max_abs = 0, max_rel = 0;
    std::size_t outside = 0;
};

Closeness compare(const ckpt::Tensor& a, const ckpt::Tensor& b, double atol, double rtol) {
    Closeness c;
    const NumberAt number = number_reader(a.dtype());  // b's dtype is a's: compare is called only then
    for (std::size_t i = 0, n = components(a); i < n; ++i) {
        const double x = number(a, i), y = number(b, i);
        if (std::isnan(x) && std::isnan(y)) continue;
        if (x == y) continue;  // also equal infinities
        const double d = std::fabs(x - y);
        const double rel = y != 0 ? d / std::fabs(y) : std::numeric_limits<double>::infinity();
        c.max_abs = std::max(c.max_abs, std::isnan(d) ? std::numeric_limits<double>::infinity() : d);
        c.max_rel = std::max(c.max_rel, std::isnan(rel) ? std::numeric_limits<double>::infinity() : rel);
        if (!(d <= atol + rtol * std::fabs(y))) ++c.outside;
    }
    return c;
}

/// Bit for bit, as tensors compare: a NaN equals itself, -0.0 does not equal 0.0.
bool bit_equal(const ckpt::Value& a, const ckpt::Value& b) {
    if (const double* x = a.get_if<double>())
        return std::bit_cast<std::uint64_t>(*x) == std::bit_cast<std::uint64_t>(*b.get_if<double>());
    return a == b;
}

int cmd_diff(const fs::path& a_path, const fs::path& b_path, double atol, double rtol) {
    const auto a = load_any(a_path), b = load_any(b_path);
    std::size_t differ = 0, same_bits = 0, close = 0;
    auto report = [&](const std::string& line) {
        std::cout << line << "\n";
        ++differ;
    };
    for (const auto& [name, va] : a) {
        const ckpt::Value* vb = b.find(name);
        if (!vb) {
            report("only in A: '" + shown(name) + "' (" + va.type_name() + ")");
            continue;
        }
        const ckpt::Tensor* ta = va.get_if<ckpt::Tensor>();
        const ckpt::Tensor* tb = vb->get_if<ckpt::Tensor>();
        // the order too: the same bytes in the other order are the transpose
        if (va.kind() != vb->kind() || (ta && (ta->dtype() != tb->dtype() || ta->logical_shape() != tb->logical_shape() ||
                                               ta->order() != tb->order()))) {
            report("'" + shown(name) + "': A has " + va.type_name() + ", B has " + vb->type_name());
            continue;
        }
        if (bit_equal(va, *vb)) {
            ++same_bits;
            continue;
        }
        if (!ta) {
            const double* da = va.get_if<double>();
            if (da && std::fabs(*da - *vb->get_if<double>()) <= atol + rtol * std::fabs(*vb->get_if<double>())) {
                ++close;
                continue;
            }
            report("'" + shown(name) + "': A = " + scalar_text(va) + ", B = " + scalar_text(*vb));
            continue;
        }
        const auto c = compare(*ta, *tb, atol, rtol);
        char line[256];
        std::snprintf(line, sizeof line, "max |A-B| %.6g, max |A-B|/|B| %.6g, %zu of %zu elements outside tolerance",
                      c.max_abs, c.max_rel, c.outside, ta->numel());
        if (c.outside == 0) {
            ++close;
            std::cout << "'" << shown(name) << "': within tolerance, not bit-equal: " << line << "\n";
        } else {
            report("'" + shown(name) + "': " + line);
        }
    }
    for (const auto& [name, vb] : b)
        if (!a.contains(name)) report("only in B: '" + shown(name) + "' (" + vb.type_name() + ")");
    std::cout << a.size() << " entries in A, " << b.size() << " in B: " << same_bits << " bit-equal, " << close
              << " within tolerance, " << differ << " different\n";
    return differ ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// export and import

int cmd_export(const fs::path& in, const fs::path& out, const Selection& sel, bool compress, bool force) {
    const auto target = format_of(out);
    if (target != FileFormat::safetensors && target != FileFormat::npz)
        throw UsageError("the output '" + out.string() + "' must end in .safetensors or .npz");
    if (compress && target != FileFormat::npz) throw UsageError("--compress applies to .npz output only");
    refuse_overwrite(out, force);
    const auto dict = sel.apply(ckpt::load_checkpoint(in, load_options));
    if (target == FileFormat::safetensors) ckpt::save_safetensors(dict, out);
    else ckpt::save_npz(dict, out, compress);
    std::cout << "exported " << entries_count(dict.size()) << " to " << shown(out) << " (" << human_size(fs::file_size(out)) << ")\n";
    return 0;
}

int cmd_import(const fs::path& in, const fs::path& out, const Selection& sel, std::int64_t epoch, std::int64_t step,
               const std::string& archive, int zstd_level, bool force) {
    if (in.extension() == ".npy")
        throw UsageError("the input '" + in.string() +
                         "' is a NumPy .npy file, a single array: ckpt imports npz archives of named arrays "
                         "(np.savez('x.npz', name=array)), .safetensors, .pt and .pth files");
    if (format_of(in) == FileFormat::checkpoint)
        throw UsageError("the input '" + in.string() + "' must end in .safetensors, .npz, .pt or .pth");
    ckpt::SaveOptions opts;
    opts.epoch = epoch;
    opts.step = step;
    opts.archive = archive == "text" ? ckpt::ArchiveKind::text : archive == "xml" ? ckpt::ArchiveKind::xml : ckpt::ArchiveKind::binary;
    if (zstd_level != 0) opts.codecs = ckpt::Zstd{zstd_level}.codecs();
    if (!load_options.key.empty()) opts.codecs.push_back(ckpt::AesGcm{load_options.key}.codecs().front());
    refuse_overwrite(out, force);
    const auto dict = sel.apply(load_any(in));
    // a file named as a series' checkpoint is written holding the series' lock, as its jobs do:
    // never into a series a job is writing
    std::optional<ckpt::detail::SeriesLock> lock;
    if (Listed probe; classify(probe, out.filename().string(), std::nullopt)) {
        const fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
        if (fs::is_directory(dir)) lock.emplace(dir, probe.prefix);
    }
    ckpt::save_checkpoint(dict, out, opts);
    std::cout << "imported " << entries_count(dict.size()) << " into " << shown(out) << " (epoch " << epoch << ", step "
              << step << ", " << archive << " archive"
              << (opts.codecs.empty() ? std::string() : ", " + ckpt::read_header(out).codec_names()) << ")\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"ckpt: look inside checkpoints, verify and compare them, convert them to and from safetensors "
                 "and NumPy npz, import PyTorch torch.save files, and plot the metrics they record.\nExit status: 0 success, "
                 "1 failure (diff: a difference), 2 usage error."};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "Help for every subcommand");

    std::string dir, file, a, b, in, out, prefix, archive = "binary", best_spec;
    std::vector<std::string> verify_paths;
    bool stats = false, as_json = false, headers_only = false, compress = false, force = false;
    std::string entry_name;
    double atol = 0, rtol = 0;
    std::int64_t epoch = 0, step = 0;
    int zstd_level = 0;
    std::string key_file;
    Selection sel;
    auto add_key_file = [&](CLI::App* cmd, const char* what) {
        cmd->add_option("--key-file", key_file, what)->check(CLI::ExistingFile);
    };
    std::optional<std::uint64_t> max_decoded;
    auto add_max_decoded = [&](CLI::App* cmd) {
        cmd->add_option("--max-decoded-bytes", max_decoded,
                        "Refuse a file that would decode to more than this many bytes (a compressed body, deflated npz "
                        "members or PyTorch records, a pickle's objects, views of one storage); default: the larger of "
                        "256 MiB and 64 times the file's size");
    };

    auto* ls = app.add_subcommand("ls", "List every checkpoint under DIR (regular, breakpoint, last-words, per-rank), "
                                        "ordered by run, epoch and step, each verified; marks what latest() picks");
    ls->add_option("DIR", dir, "Checkpoint directory")->required();
    ls->add_option("--prefix", prefix, "Only this prefix's checkpoints (all its runs)");
    ls->add_flag("--headers-only", headers_only, "Read headers only; do not verify checksums");
    ls->add_flag("--json", as_json, "Print JSON");
    bool clean = false;
    ls->add_flag("--clean", clean, "First remove the temporaries of saves whose writer is gone (killed mid-save)");
    add_max_decoded(ls);
    ls->add_option("--best", best_spec,
                   "Mark in each prefix the checkpoint with the best recorded METRIC that verifies, as ckpt::best() "
                   "finds it (METRIC:max when larger is better)");

    auto* show = app.add_subcommand("show", "Show a checkpoint's header and entries (the payloads are not read), or a .safetensors, .npz, .pt or .pth file's entries");
    show->add_option("FILE", file, "Checkpoint file (or .safetensors, .npz, .pt, .pth)")->required();
    show->add_flag("--stats", stats,
                   "Verify the file, read the payloads and add per-tensor min, max, mean, std over finite values, and "
                   "the count of NaN and Inf");
    show->add_flag("--json", as_json, "Print JSON");
    show->add_option("--entry", entry_name,
                     "Show one entry with its statistics, reading and verifying only its bytes (a file of format version "
                     "3; others are verified whole)");
    add_key_file(show, "Key of an encrypted checkpoint (32 bytes, or 64 hex digits): without it only the header shows");
    add_max_decoded(show);

    auto* verify = app.add_subcommand("verify", "Verify checkpoint files (header and checksum); exit 0 only if all pass");
    verify->add_option("PATH", verify_paths, "Checkpoint files, or directories searched for *.ckpt")->required();
    add_key_file(verify, "Also decrypt and authenticate encrypted checkpoints with this key (the checksum needs none)");
    add_max_decoded(verify);

    auto* diff = app.add_subcommand("diff", "Compare two checkpoints (or .safetensors/.npz/.pt/.pth files) entry by entry "
                                            "(a tensor's dtype, shape and storage order first, then its elements); "
                                            "exit 0 when equal within tolerance, 1 otherwise");
    diff->add_option("A", a, "First file")->required();
    diff->add_option("B", b, "Second file")->required();
    diff->add_option("--atol", atol, "Absolute tolerance (default 0)")->check(CLI::NonNegativeNumber);
    diff->add_option("--rtol", rtol, "Relative tolerance, of |B| (default 0)")->check(CLI::NonNegativeNumber);
    add_key_file(diff, "Key of encrypted checkpoints");
    add_max_decoded(diff);

    auto add_selection = [&](CLI::App* cmd) {
        cmd->add_option("--select", sel.select, "Only entries whose name matches this regular expression");
        cmd->add_option("--rename", sel.renames, "Rename entries starting with FROM to start with TO (FROM=TO; repeatable)");
        cmd->add_flag("--force", force, "Replace the output file if it exists");
    };
    auto* exp = app.add_subcommand("export", "Write a checkpoint's entries to a .safetensors or .npz file (column-major "
                                             "tensors: to npz as they are, Fortran-ordered; to safetensors, which has no "
                                             "order, transposed into row-major order)");
    exp->add_option("FILE", in, "Checkpoint file")->required();
    exp->add_option("OUT", out, "Output file: .safetensors or .npz")->required();
    exp->add_flag("--compress", compress, "Deflate the npz members (np.savez_compressed)");
    add_key_file(exp, "Key of an encrypted checkpoint");
    add_max_decoded(exp);
    add_selection(exp);

    auto* imp = app.add_subcommand("import", "Write the entries of a .safetensors, .npz or PyTorch .pt/.pth file (torch.save; "
                                             "nested dicts flattened with dots) as a checkpoint (Fortran-ordered npz "
                                             "arrays as column-major tensors)");
    imp->add_option("IN", in, "Input file: .safetensors, .npz, .pt or .pth")->required();
    imp->add_option("OUT", out, "Checkpoint file to write")->required();
    imp->add_option("--epoch", epoch, "Epoch recorded in the header")->check(CLI::NonNegativeNumber);
    imp->add_option("--step", step, "Step recorded in the header")->check(CLI::NonNegativeNumber);
    imp->add_option("--archive", archive, "Body archive")->check(CLI::IsMember({"binary", "text", "xml"}));
    imp->add_option("--zstd", zstd_level, "Compress the body with zstd at this level (1 .. 19)")->check(CLI::Range(1, 19));
    add_key_file(imp, "Encrypt the body with AES-256-GCM under this key (after --zstd)");
    add_max_decoded(imp);
    add_selection(imp);

    std::vector<std::string> plot_metrics;
    int plot_timeout = 60;
    auto* plot = app.add_subcommand("plot", "Draw metrics the checkpoints under DIR record over the training, with gnuplot, "
                                            "as a PNG; print the points as a table");
    plot->add_option("DIR", dir, "Checkpoint directory")->required();
    plot->add_option("--metric", plot_metrics, "A recorded metric to draw, one series each (repeatable)")
        ->required()
        ->allow_extra_args(false);
    plot->add_option("-o,--output", out, "PNG file to write")->required();
    plot->add_option("--prefix", prefix, "Only this prefix's checkpoints (all its runs)");
    add_max_decoded(plot);
    plot->add_flag("--force", force, "Replace the output file if it exists");
    plot->add_option("--timeout", plot_timeout, "Seconds gnuplot may take before it is killed (default 60)")
        ->check(CLI::Range(1, 3600));
    plot->footer(
        "Only checkpoints that verify are drawn; the others are named on stderr, with the reason.\n"
        "x axis: the global step when every checkpoint drawn has one (StepNaming and last-words names\n"
        "carry it; in the first epoch the step is the global step). Otherwise the epoch: a save within\n"
        "an epoch at (epoch - 1) + step / the most steps any of them records, the end of epoch e at e.\n"
        "Each run of the prefix (exp, exp_1, ...) is its own stretch of line; a dashed vertical line\n"
        "labelled 'restart' marks the first checkpoint of every run after the first.\n"
        "Needs gnuplot (apt-get install gnuplot-nox).");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help: usage on stdout
        std::cerr << "ckpt: " << ckpt::detail::printable(e.what()) << "\nRun 'ckpt --help' or 'ckpt SUBCOMMAND --help' for usage.\n";
        return 2;
    }
    ckpt::set_log_sink([](ckpt::LogLevel, std::string_view) {});  // findings are in the output
    try {
        if (!key_file.empty()) load_options.key = ckpt::Key::from_file(key_file);
        load_options.max_decoded_bytes = interop_options.max_decoded_bytes = max_decoded;
        if (*ls)
            return cmd_ls(dir, prefix.empty() ? std::nullopt : std::optional(prefix), headers_only, as_json,
                          best_spec.empty() ? std::nullopt : std::optional(parse_best(best_spec)), clean);
        if (*show) return show->count("--entry") ? cmd_show_entry(file, entry_name, as_json) : cmd_show(file, stats, as_json);
        if (*verify) {
            std::vector<fs::path> paths(verify_paths.begin(), verify_paths.end());
            return cmd_verify(paths);
        }
        if (*diff) return cmd_diff(a, b, atol, rtol);
        if (*exp) return cmd_export(in, out, sel, compress, force);
        if (*imp) return cmd_import(in, out, sel, epoch, step, archive, zstd_level, force);
        if (*plot)
            return cmd_plot(dir, prefix.empty() ? std::nullopt : std::optional(prefix), plot_metrics, out, force,
                            std::chrono::seconds(plot_timeout));
    } catch (const UsageError& e) {
        std::cerr << "ckpt: " << ckpt::detail::printable(e.what()) << "\n";
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "ckpt: " << ckpt::detail::printable(e.what()) << "\n";
        return 1;
    }
    return 2;
}
