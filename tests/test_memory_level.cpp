// The memory level: packed states, copies in a partner's memory, recovery from them.

#include <doctest/doctest.h>

#include <fault/fault.hpp>

#include "dp_support.hpp"

#include <optional>
#include <string>
#include <vector>

namespace {

/// Rank r's state at global step s: different on every rank and at every step.
ckpt::ParamDict state_of(int r, std::int64_t s) {
    ckpt::ParamDict d;
    std::vector<float> w(1000 + 10 * static_cast<std::size_t>(r));  // ranks' sizes differ (a sharded optimizer)
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(r) * 1000.0f + static_cast<float>(s) + 0.001f * float(i);
    d.set("net.w", ckpt::Tensor::from(w, {static_cast<std::int64_t>(w.size())}));
    d.set("data.order", ckpt::Tensor::from(std::vector<std::int64_t>{s, r, 3}, {3}));
    d.set("trainer.global_step", s);
    d.set("lr", 0.01 * double(s));
    d.set("shuffled", r % 2 == 0);
    d.set("name", "rank " + std::to_string(r));
    return d;
}

/// Every rank of a `levels.size()`-rank group runs fn(comm, its level); no rank may fail.
void on_ranks(std::vector<fault::MemoryLevel>& levels, const std::function<void(fault::ThreadComm&, fault::MemoryLevel&)>& fn) {
    fault::ThreadGroup group(static_cast<int>(levels.size()), std::chrono::seconds(10));
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        fn(comm, levels[static_cast<std::size_t>(comm.rank())]);
    });
    for (const auto& e : errors) REQUIRE_FALSE(e);
}

std::vector<std::optional<fault::MemoryRecovery>> recover_all(std::vector<fault::MemoryLevel>& levels) {
    std::vector<std::optional<fault::MemoryRecovery>> out(levels.size());
    on_ranks(levels, [&](fault::ThreadComm& comm, fault::MemoryLevel& level) {
        out[static_cast<std::size_t>(comm.rank())] = level.recover(comm);
    });
    return out;
}

void save_steps(std::vector<fault::MemoryLevel>& levels, std::initializer_list<std::int64_t> steps) {
    on_ranks(levels, [&](fault::ThreadComm& comm, fault::MemoryLevel& level) {
        for (const auto s : steps) level.save(comm, state_of(comm.rank(), s), s);
    });
}

/// Rank `comm.rank()` of a 4-rank data-parallel job training `epochs` epochs, resumed from
/// `from` if given, with memory snapshots every 3 steps; with `fail_after` ≥ 0 the rank
/// `fail_rank` fails after that global step. Returns its final parameters.
std::vector<float> train_dp(fault::ThreadComm& comm, fault::MemoryLevel& level, std::int64_t epochs,
                            const std::optional<fault::MemoryRecovery>& from, fault::MemoryCheckpointOptions options,
                            std::int64_t fail_after = -1, int fail_rank = 2) {
    constexpr int ranks = 4;
    auto data = test::shard_of(ranks, comm.rank());
    nn::UceNet net(7);
    test::DpStack stack(net, comm, options.layout.shard_size);
    nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
    std::int64_t initial_epoch = 0;
    if (from) {
        const auto rp = trainer.resume_from_state(from->state, "memory, step " + std::to_string(from->step), data);
        stack.opt().set_completed_steps(rp.global_step);
        initial_epoch = rp.initial_epoch;
    }
    fault::MemoryCheckpoint<fault::ThreadComm> every_3(comm, level, 3, options);
    struct Failure {
        std::int64_t after;
        bool here;
        void on_step_end(nn::RunContext& c) {
            if (here && c.global_step == after) throw std::runtime_error("rank failed after global step " + std::to_string(after));
        }
    } failure{fail_after, comm.rank() == fail_rank};
    trainer.train(epochs, data, nn::callbacks(every_3, failure), initial_epoch);
    return test::flat(net.parameters());
}

/// Every rank's parameters after 2 epochs of train_dp without a failure.
test::Params straight_params() {
    std::vector<fault::MemoryLevel> levels(4);
    test::Params straight(4);
    on_ranks(levels, [&](fault::ThreadComm& comm, fault::MemoryLevel& level) {
        straight[static_cast<std::size_t>(comm.rank())] = train_dp(comm, level, 2, std::nullopt, {});
    });
    return straight;
}

/// Rank 2's process lost: every rank recovers from `levels`, must agree on `step`, trains to
/// the end of epoch 2 and must end with the parameters of `straight`.
void resume_and_compare(std::vector<fault::MemoryLevel>& levels, std::int64_t step, fault::MemoryCheckpointOptions options,
                        const test::Params& straight) {
    levels[2] = fault::MemoryLevel{};
    test::Params resumed(levels.size());
    on_ranks(levels, [&](fault::ThreadComm& comm, fault::MemoryLevel& level) {
        const auto got = level.recover(comm);
        REQUIRE(got);
        CHECK(got->step == step);
        resumed[static_cast<std::size_t>(comm.rank())] = train_dp(comm, level, 2, got, options);
    });
    for (std::size_t r = 0; r < levels.size(); ++r) CHECK(resumed[r] == straight[r]);
}

}  // namespace

TEST_CASE("a packed state unpacks to the entries it was packed from, and a damaged one is refused") {
    fault::PackedState p;
    CHECK(p.step() == -1);
    const ckpt::ParamDict d = state_of(3, 17);
    p.pack(d, 17);
    CHECK(p.step() == 17);
    CHECK(p.intact());
    const ckpt::ParamDict back = p.unpack("test state");
    REQUIRE(back.size() == d.size());
    for (const auto& e : d) CHECK_MESSAGE(back.at(e.name) == e.value, e.name);

    // one bit of a payload flipped: the checksum says so, naming the state
    fault::PackedState damaged = p;
    auto words = damaged.receive_buffer(damaged.bytes());
    words[words.size() / 2] = -words[words.size() / 2];
    damaged.received();
    CHECK_FALSE(damaged.intact());
    CHECK_THROWS_WITH_AS(damaged.unpack("rank 3's copy"), doctest::Contains("rank 3's copy: not a whole packed state"),
                         fault::CorruptState);
    // cut short (a transfer that did not finish)
    fault::PackedState torn = p;
    torn.receive_buffer(p.bytes() - 8);
    CHECK_THROWS_AS(torn.unpack("torn"), fault::CorruptState);
    torn.received();
    CHECK_THROWS_AS(torn.unpack("torn"), fault::CorruptState);
    // received into, but not to the end: never whole
    fault::PackedState half = p;
    half.receive_buffer(p.bytes());
    CHECK(half.empty());
    CHECK(half.step() == -1);

    // a column-major tensor comes back in its order
    ckpt::ParamDict ordered;
    ordered.set("m", ckpt::Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}, ckpt::Order::column_major));
    p.pack(ordered, 17);
    CHECK(p.unpack("ordered").tensor("m") == ordered.tensor("m"));

    // packing a smaller state again reuses the block and forgets the old entries
    ckpt::ParamDict small;
    small.set("x", std::int64_t{5});
    p.pack(small, 18);
    const ckpt::ParamDict again = p.unpack("small");
    CHECK(again.size() == 1);
    CHECK(again.get<std::int64_t>("x") == 5);
}

TEST_CASE("a restarted rank gets its state from its partner's memory, and every rank rolls back to the same step") {
    for (int lost = 0; lost < 4; ++lost) {
        CAPTURE(lost);
        std::vector<fault::MemoryLevel> levels(4);
        save_steps(levels, {2, 4, 6});
        levels[static_cast<std::size_t>(lost)] = fault::MemoryLevel{};  // its process died: its memory is gone
        const auto got = recover_all(levels);
        for (int r = 0; r < 4; ++r) {
            CAPTURE(r);
            REQUIRE(got[r]);
            CHECK(got[r]->step == 6);
            CHECK(got[r]->restored_from_partners == 1);
            CHECK(got[r]->source == (r == lost ? "rank " + std::to_string((lost + 1) % 4) + "'s memory" : "its own memory"));
            const ckpt::ParamDict want = state_of(r, 6);
            for (const auto& e : want) CHECK_MESSAGE(got[r]->state.at(e.name) == e.value, e.name);
        }
        // the restarted rank holds its state again, so the next recovery finds it too
        CHECK(levels[static_cast<std::size_t>(lost)].newest_step() == 6);
    }
}

TEST_CASE("a copy cut off mid-transfer is never used: recovery takes the previous whole one") {
    std::vector<fault::MemoryLevel> levels(4);
    save_steps(levels, {2, 4});
    {
        // step 6: rank 1 dies after sending its copy's length, before the copy itself
        fault::ThreadGroup group(4, std::chrono::seconds(10));
        const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            if (comm.rank() == 1) {
                const auto head = fault::detail::to_floats(std::uint64_t{4096});
                comm.send(std::span<const float>(head), 2, fault::MemoryLevel::tag);
                throw std::runtime_error("rank 1 killed in the middle of a transfer");
            }
            levels[static_cast<std::size_t>(comm.rank())].save(comm, state_of(comm.rank(), 6), 6);
        });
        CHECK(fault::detail::holds<fault::PeerFailure>(errors[2]));
    }
    levels[1] = fault::MemoryLevel{};
    const auto got = recover_all(levels);
    for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        REQUIRE(got[r]);
        CHECK(got[r]->step == 4);  // rank 2 holds rank 1's state at 4 only
        const ckpt::ParamDict want = state_of(r, 4);
        for (const auto& e : want) CHECK_MESSAGE(got[r]->state.at(e.name) == e.value, e.name);
    }
    CHECK(got[1]->source == "rank 2's memory");
}

TEST_CASE("a damaged copy is dropped when recovery checks it, and the ranks agree on an older step") {
    std::vector<fault::MemoryLevel> levels(4);
    save_steps(levels, {2, 4, 6});
    fault::PackedState* copy = levels[2].copy(1, 6);  // rank 2's copy of rank 1 at step 6
    REQUIRE(copy);
    auto words = copy->receive_buffer(copy->bytes());
    words[words.size() - 1] += 1.0f;  // a bit flipped in memory since it arrived
    copy->received();
    levels[1] = fault::MemoryLevel{};
    const auto got = recover_all(levels);
    for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        REQUIRE(got[r]);
        CHECK(got[r]->step == 4);
        CHECK(got[r]->state.at("net.w") == state_of(r, 4).at("net.w"));
    }
    CHECK(got[1]->source == "rank 2's memory");
    CHECK_FALSE(levels[2].copy(1, 6));  // dropped
}

TEST_CASE("a rank lost with its partner: nothing is recovered from memory, on every rank alike") {
    std::vector<fault::MemoryLevel> levels(4);
    save_steps(levels, {3, 6});
    levels[1] = fault::MemoryLevel{};
    levels[2] = fault::MemoryLevel{};  // rank 1's only partner
    for (const auto& g : recover_all(levels)) CHECK_FALSE(g);

    SUBCASE("with two replicas, the next partner has it") {
        std::vector<fault::MemoryLevel> two;
        for (int r = 0; r < 4; ++r) two.emplace_back(2);
        save_steps(two, {3, 6});
        two[1] = fault::MemoryLevel{2};
        two[2] = fault::MemoryLevel{2};
        const auto got = recover_all(two);
        for (int r = 0; r < 4; ++r) {
            CAPTURE(r);
            REQUIRE(got[r]);
            CHECK(got[r]->step == 6);
            CHECK(got[r]->state.at("net.w") == state_of(r, 6).at("net.w"));
        }
        CHECK(got[1]->source == "rank 3's memory");  // 1 + 2
        CHECK(got[2]->source == "rank 3's memory");
    }
}

TEST_CASE("the memory level holds nothing for a world of another size, nor before its first save") {
    std::vector<fault::MemoryLevel> none(3);
    for (const auto& g : recover_all(none)) CHECK_FALSE(g);

    std::vector<fault::MemoryLevel> levels(4);
    save_steps(levels, {5});
    std::vector<fault::MemoryLevel> three(levels.begin(), levels.begin() + 3);
    for (const auto& g : recover_all(three)) CHECK_FALSE(g);
    CHECK_THROWS_AS(fault::MemoryLevel(0), ckpt::ConfigError);
    CHECK_THROWS_AS(fault::MemoryLevel(5), ckpt::ConfigError);
}

TEST_CASE("training resumed from the memory level ends bit-identical to training without a failure") {
    constexpr int ranks = 4;
    const test::Params straight = straight_params();
    for (const bool background : {true, false}) {
        CAPTURE(background);
        // one epoch (8 steps: snapshots at 3 and 6), then rank 2's process is lost
        std::vector<fault::MemoryLevel> levels(ranks);
        on_ranks(levels, [&](fault::ThreadComm& comm, fault::MemoryLevel& level) {
            train_dp(comm, level, 1, std::nullopt, {.background = background});
        });
        resume_and_compare(levels, 6, {.background = background}, straight);
    }
}

TEST_CASE("last words in memory: recovery resumes at the step the survivors reached, from a replica") {
    std::vector<fault::MemoryLevel> levels(4);
    save_steps(levels, {2, 4});
    // a failure after step 5: ranks 0, 1 and 3 keep their (equal, data-parallel) states
    for (const int r : {0, 1, 3}) levels[static_cast<std::size_t>(r)].keep_last_words(4, state_of(0, 5), 5);
    CHECK(levels[0].last_words_step() == 5);
    levels[2] = fault::MemoryLevel{};
    auto got = recover_all(levels);
    for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        REQUIRE(got[r]);
        CHECK(got[r]->step == 5);
        CHECK(got[r]->state.at("net.w") == state_of(0, 5).at("net.w"));
        CHECK(got[r]->from_rank == (r == 2 ? 0 : -1));
    }
    CHECK(got[2]->source == "rank 0's last words");
    CHECK(got[2]->restored_from_partners == 1);

    SUBCASE("a survivor torn inside its update has none, and takes a replica's too") {
        std::vector<fault::MemoryLevel> torn(4);
        save_steps(torn, {2, 4});
        for (const int r : {1, 3}) torn[static_cast<std::size_t>(r)].keep_last_words(4, state_of(0, 5), 5);
        torn[2] = fault::MemoryLevel{};
        got = recover_all(torn);
        for (int r = 0; r < 4; ++r) {
            CAPTURE(r);
            REQUIRE(got[r]);
            CHECK(got[r]->step == 5);
            CHECK(got[r]->state.at("net.w") == state_of(0, 5).at("net.w"));
        }
        CHECK(got[0]->source == "rank 1's last words");
        CHECK(got[2]->source == "rank 1's last words");
    }
    SUBCASE("with a sharded optimizer only a rank keeping the same piece is a replica") {
        // shard size 2: ranks 0 and 2 keep piece 0, ranks 1 and 3 piece 1; rank 0 is torn,
        // so rank 2's piece is at step 5 nowhere, and every rank rolls back to step 4
        std::vector<fault::MemoryLevel> sharded(4);
        save_steps(sharded, {2, 4});
        for (const int r : {1, 3}) sharded[static_cast<std::size_t>(r)].keep_last_words(4, state_of(1, 5), 5, fault::ShardLayout{2});
        sharded[2] = fault::MemoryLevel{};
        got = recover_all(sharded);
        for (int r = 0; r < 4; ++r) {
            CAPTURE(r);
            REQUIRE(got[r]);
            CHECK(got[r]->step == 4);
            CHECK(got[r]->state.at("net.w") == state_of(r, 4).at("net.w"));
        }
        CHECK(got[2]->source == "rank 3's memory");
        CHECK(sharded[1].last_words_step() == -1);  // the abandoned timeline's
    }
}

TEST_CASE("with last words in memory, training resumes where the survivors stopped and ends bit-identical") {
    constexpr int ranks = 4;
    const test::Params straight = straight_params();
    // rank 2 fails after global step 10 (snapshots at 3, 6 and 9); the others keep step 10
    std::vector<fault::MemoryLevel> levels(ranks);
    {
        fault::ThreadGroup group(ranks, std::chrono::seconds(10));
        const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            train_dp(comm, levels[static_cast<std::size_t>(comm.rank())], 2, std::nullopt, {.last_words = true}, 10);
        });
        for (const int r : {0, 1, 3}) CHECK(fault::detail::holds<fault::PeerFailure>(errors[static_cast<std::size_t>(r)]));
    }
    CHECK(levels[2].last_words_step() == -1);  // its own failure: its state is not to be trusted
    resume_and_compare(levels, 10, {.last_words = true}, straight);
}
