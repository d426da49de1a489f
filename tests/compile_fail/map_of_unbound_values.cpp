// Must not compile: a map whose values a value map cannot hold, given to view_of.
// Expected diagnostic: what view_of binds, and ckpt::object for other maps.
#include <ckpt/ckpt.hpp>

#include <map>
#include <set>
#include <string>

int main() {
    std::map<std::string, std::set<int>> groups;
    ckpt::ParamDict d;
    d.set("groups", ckpt::view_of(groups));
}
