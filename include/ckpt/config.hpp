#pragma once
// CheckpointConfig: the seed's run-time knobs, mapped onto the same policies.
//
//   ckpt::CheckpointConfig cfg;
//   cfg.save_checkpoint_steps = 100;
//   cfg.keep_checkpoint_max = 5;
//   cfg.append_info = {"epoch_num", "step_num"};
//   auto mgr = ckpt::make_manager("ckpts", "lenet", cfg);
//
// The seed's rules for conflicting settings: save_checkpoint_steps wins over
// save_checkpoint_seconds; keep_checkpoint_max wins over keep_checkpoint_per_n_minutes; all
// four zero is an error. As in the seed, the last step is also saved when training ends.
// enc_key (with enc_mode "AES-GCM", the seed's default) encrypts with AES-256-GCM and needs
// <ckpt/codecs/aes_gcm.hpp>; zstd_level compresses first and needs <ckpt/codecs/zstd.hpp>.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "append_info.hpp"
#include "codecs/codec.hpp"
#include "error.hpp"
#include "manager.hpp"
#include "policies/retention.hpp"
#include "policies/save.hpp"

namespace ckpt {

/// The seed's run-time settings of a series (MindSpore's CheckpointConfig), which make_manager()
/// turns into policies: when to save, how many to keep, what to add to every file, exception and
/// async saves, encryption and compression. Conflicting settings resolve as in the seed
/// (save_checkpoint_steps wins over save_checkpoint_seconds, keep_checkpoint_max over
/// keep_checkpoint_per_n_minutes).
struct CheckpointConfig {
    std::int64_t save_checkpoint_steps = 1;
    std::int64_t save_checkpoint_seconds = 0;
    std::int64_t keep_checkpoint_max = 5;
    std::int64_t keep_checkpoint_per_n_minutes = 0;
    AppendInfo append_info;
    bool exception_save = false;
    bool async_save = false;
    Key enc_key;                      ///< when set, checkpoints are encrypted (and restore() decrypts)
    std::string enc_mode = "AES-GCM"; ///< the only mode ckpt writes (as AES-256-GCM)
    int zstd_level = 0;               ///< 0: no compression; else zstd at this level, before encryption
};

namespace detail {
inline void validate(const CheckpointConfig& c) {
    auto non_negative = [](std::int64_t v, const char* name) {
        if (v < 0) throw ConfigError(std::string(name) + " must not be negative, got " + std::to_string(v));
    };
    non_negative(c.save_checkpoint_steps, "save_checkpoint_steps");
    non_negative(c.save_checkpoint_seconds, "save_checkpoint_seconds");
    non_negative(c.keep_checkpoint_max, "keep_checkpoint_max");
    non_negative(c.keep_checkpoint_per_n_minutes, "keep_checkpoint_per_n_minutes");
    if (!c.save_checkpoint_steps && !c.save_checkpoint_seconds && !c.keep_checkpoint_max &&
        !c.keep_checkpoint_per_n_minutes)
        throw ConfigError(
            "save_checkpoint_steps, save_checkpoint_seconds, keep_checkpoint_max and keep_checkpoint_per_n_minutes "
            "cannot all be 0");
}
}  // namespace detail

/// The SavePolicy a CheckpointConfig stands for.
class ConfiguredSave {
public:
    explicit ConfiguredSave(const CheckpointConfig& c) {
        detail::validate(c);
        if (c.save_checkpoint_steps > 0) steps_ = EverySteps(c.save_checkpoint_steps);
        else if (c.save_checkpoint_seconds > 0) seconds_ = EverySeconds(static_cast<double>(c.save_checkpoint_seconds));
    }
    bool should_save(const Progress& p) {
        // every member sees every event, so the timer starts with the first step
        const bool by_seconds = seconds_ && seconds_->should_save(p);
        return (steps_ && steps_->should_save(p)) || by_seconds || at_end_.should_save(p);
    }
    void saved(const Progress& p) {
        if (seconds_) seconds_->saved(p);
    }

private:
    std::optional<EverySteps> steps_;
    std::optional<EverySeconds> seconds_;
    OnTrainEnd at_end_;
};

/// The RetentionPolicy a CheckpointConfig stands for (keep all when both knobs are 0).
class ConfiguredRetention {
public:
    explicit ConfiguredRetention(const CheckpointConfig& c) {
        detail::validate(c);
        if (c.keep_checkpoint_max > 0) last_ = KeepLast(c.keep_checkpoint_max);
        else if (c.keep_checkpoint_per_n_minutes > 0)
            per_minutes_ = KeepOnePerMinutes(static_cast<double>(c.keep_checkpoint_per_n_minutes));
    }
    std::vector<std::size_t> to_delete(std::span<const StoredCheckpoint> files) const {
        if (last_) return last_->to_delete(files);
        if (per_minutes_) return per_minutes_->to_delete(files);
        return {};
    }

private:
    std::optional<KeepLast> last_;
    std::optional<KeepOnePerMinutes> per_minutes_;
};

/// The CodecPolicy a CheckpointConfig stands for: zstd if zstd_level is set, then AES-256-GCM
/// if enc_key is.
class ConfiguredCodec {
public:
    explicit ConfiguredCodec(const CheckpointConfig& c) {
        if (c.zstd_level != 0) chain_.push_back(Codec{CodecId::zstd, c.zstd_level, {}});
        if (!c.enc_key.empty()) {
            if (c.enc_mode != "AES-GCM")
                throw ConfigError("enc_mode '" + c.enc_mode + "' is not supported: ckpt encrypts with AES-GCM (AES-256-GCM)");
            chain_.push_back(Codec{CodecId::aes_256_gcm, 0, c.enc_key});
        }
    }
    CodecChain codecs() const { return chain_; }

private:
    CodecChain chain_;
};

namespace detail {
inline ManagerOptions manager_options(const CheckpointConfig& config) {
    ManagerOptions opts;
    opts.append_info = config.append_info;
    opts.exception_save = config.exception_save;
    opts.async_save = config.async_save;
    return opts;
}
}  // namespace detail

/// What make_manager() returns: a CheckpointManager whose save, retention and codec policies a
/// CheckpointConfig sets at run time.
template <NamingPolicy N = MindSporeNaming, ArchivePolicy A = BinaryArchive>
using ConfiguredManager = CheckpointManager<ConfiguredSave, ConfiguredRetention, N, A, ConfiguredCodec>;

/// A manager of `prefix` in `directory` set up by `config`: its policies and options (append_info,
/// exception_save, async_save); `naming` names the files (MindSporeNaming's names, as the seed's,
/// by default). ConfigError when a setting is negative, when the four save and keep settings are
/// all 0, or when enc_mode is not "AES-GCM".
template <NamingPolicy N = MindSporeNaming, ArchivePolicy A = BinaryArchive>
ConfiguredManager<N, A> make_manager(PathArg directory, std::string prefix, const CheckpointConfig& config,
                                     N naming = {}) {
    return ConfiguredManager<N, A>(std::move(directory), std::move(prefix), ConfiguredSave(config),
                                   ConfiguredRetention(config), std::move(naming), detail::manager_options(config),
                                   ConfiguredCodec(config));
}

}  // namespace ckpt
