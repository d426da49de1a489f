#pragma once
// The seed's append_info: extra values stored in every checkpoint a manager writes.
//   ckpt::AppendInfo info{"epoch_num", "step_num", ckpt::ParamDict{{"lr", 0.01}, {"momentum", 0.9}}};
// "epoch_num" stores the current epoch, "step_num" the global step; a dict's entries are
// stored as they are (int, float, bool, string or tensor values).

#include <initializer_list>
#include <string>
#include <variant>

#include "error.hpp"
#include "param_dict.hpp"
#include "progress.hpp"

namespace ckpt {

/// Values a manager adds to every checkpoint it writes (ManagerOptions::append_info, the seed's
/// append_info): "epoch_num" (the epoch) and "step_num" (the global step) when listed, and the
/// entries of each ParamDict given, as they are.
struct AppendInfo {
    /// One item of the seed's list: the string "epoch_num" or "step_num", or a dict.
    struct Item {
        std::variant<std::string, ParamDict> v;
        Item(const char* s) : v(std::string(s)) {}
        Item(std::string s) : v(std::move(s)) {}
        Item(ParamDict d) : v(std::move(d)) {}
    };

    bool epoch_num = false;
    bool step_num = false;
    ParamDict extra;

    AppendInfo() = default;
    AppendInfo(std::initializer_list<Item> items) {
        for (const auto& item : items) {
            if (const auto* s = std::get_if<std::string>(&item.v)) {
                if (*s == "epoch_num") epoch_num = true;
                else if (*s == "step_num") step_num = true;
                else
                    throw ConfigError("append_info accepts the strings \"epoch_num\" and \"step_num\" and dicts, not \"" +
                                      *s + "\"");
            } else {
                for (const auto& [name, value] : std::get<ParamDict>(item.v)) extra.set(name, value);
            }
        }
    }

    bool empty() const { return !epoch_num && !step_num && extra.empty(); }

    /// Refuses a state that holds a name append_info also sets with another value: one would
    /// silently replace the other in the file. The same value in both (the seed's {lr, momentum}
    /// beside the optimizer's hyperparameters) loses nothing and is allowed.
    void check_disjoint(const ParamDict& dict, const Progress& p, const std::string& prefix) const {
        ParamDict mine;
        apply(mine, p);
        for (const auto& [name, value] : mine)
            if (const Value* there = dict.find(name); there && !(*there == value))
                throw ConfigError("append_info of checkpoint prefix '" + prefix + "' sets '" + name + "' to " +
                                  describe(value) + ", but the saved state holds '" + name + "' = " + describe(*there) +
                                  ": one would replace the other; rename one of them");
    }

    static std::string describe(const Value& v) {
        if (const auto* i = v.get_if<std::int64_t>()) return std::to_string(*i);
        if (const auto* d = v.get_if<double>()) return std::to_string(*d);
        if (const auto* b = v.get_if<bool>()) return *b ? "true" : "false";
        if (const auto* s = v.get_if<std::string>()) return "\"" + *s + "\"";
        return "a " + v.type_name() + " tensor";
    }

    /// Adds the values for `p` to `dict`.
    void apply(ParamDict& dict, const Progress& p) const {
        if (epoch_num) dict.set("epoch_num", p.epoch);
        if (step_num) dict.set("step_num", p.global_step);
        for (const auto& [name, value] : extra) dict.set(name, value);
    }
};

}  // namespace ckpt
