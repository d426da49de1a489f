// Checkpoints saved by N ranks, loaded by M: the global index and the resharding load.

#include <doctest/doctest.h>

#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/codecs/zstd.hpp>
#include <fault/fault.hpp>

#include "dp_support.hpp"
#include "support.hpp"

#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = boost::filesystem;

/// 0, 1, 2, … as float32 of `shape`, plus `offset`.
ckpt::Tensor iota(const ckpt::Shape& shape, float offset = 0) {
    std::size_t n = 1;
    for (const auto d : shape) n *= static_cast<std::size_t>(d);
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), offset);
    return ckpt::Tensor::from(v, shape);
}

/// A trainer's context at global step `step` of epoch 1 (10 steps an epoch), whose state is
/// `state`'s: what a checkpoint callback's hook is given.
nn::RunContext step_context(std::int64_t step, std::function<ckpt::ParamDict()> state) {
    nn::RunContext c;
    c.epoch = 1;
    c.step = c.global_step = step;
    c.steps_per_epoch = 10;
    c.state = std::move(state);
    return c;
}

/// Saves this rank's `share` of step `step` in dir/rank_<r>/step_<step>.ckpt and commits the
/// step's index over `declared` and the share's places, in chunks of 4 KiB.
void save_share(fault::ThreadComm& comm, const fs::path& dir, std::int64_t step, const fault::ReplicaShare& share,
                const ckpt::PieceMap& declared) {
    const fs::path file = dir / ("rank_" + std::to_string(comm.rank())) / ("step_" + std::to_string(step) + ".ckpt");
    fs::create_directories(file.parent_path());
    ckpt::save_checkpoint(share.state, file);
    ckpt::PieceMap places = declared;
    for (const auto& [name, place] : share.places) places[name] = place;
    fault::commit_global_index(comm, dir, step, file, places, 4096);
}

/// Elements [first, first + n) of iota(shape) as a flat tensor.
ckpt::Tensor iota_piece(std::uint64_t first, std::uint64_t n) {
    return iota({static_cast<std::int64_t>(n)}, static_cast<float>(first));
}

/// `ranks` files under `dir`: each holds the whole "w" (replicated) and piece r of "m", a
/// [rows, 64] tensor split by ShardLayout{ranks}; and the index of step 7 over them. The files
/// are saved with `save`, read back with `read`.
fs::path save_sharded(const fs::path& dir, int ranks, std::int64_t rows, std::uint64_t chunk_bytes,
                      const ckpt::SaveOptions& save = {}, const ckpt::LoadOptions& read = {}) {
    const ckpt::Shape global{rows, 64};
    const std::uint64_t n = static_cast<std::uint64_t>(rows) * 64;
    fault::ThreadGroup group(ranks, std::chrono::seconds(10));
    fs::path index;
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        const auto [lo, hi] = fault::ShardLayout{ranks}.piece(n, comm.rank());
        ckpt::ParamDict d;
        d.set("w", iota({3, 5}));
        d.set("moments.m", iota_piece(lo, hi - lo));
        d.set("trainer.global_step", std::int64_t{7});
        d.set("name", "rank " + std::to_string(comm.rank()));
        const fs::path file = dir / ("rank_" + std::to_string(comm.rank())) / "step_7.ckpt";
        fs::create_directories(file.parent_path());
        ckpt::save_checkpoint(d, file, save);
        // each rank's "name" is its own; declared replicated: a load takes the lowest rank's
        const ckpt::PieceMap places{{"moments.m", {"moments.m", global, lo}}, {"name", ckpt::PiecePlace::replicated()}};
        const auto path = fault::commit_global_index(comm, dir, 7, file, places, chunk_bytes, read);
        if (comm.rank() == 0) index = path;
    });
    for (const auto& e : errors) REQUIRE_FALSE(e);
    return index;
}

/// What a rank of layout {shard_size} of `rows` rows wants: the whole "w", its piece of "m".
std::pair<ckpt::ParamDict, ckpt::PieceMap> wanted(std::int64_t rows, int shard_size, int shard) {
    const std::uint64_t n = static_cast<std::uint64_t>(rows) * 64;
    const auto [lo, hi] = fault::ShardLayout{shard_size}.piece(n, shard);
    ckpt::ParamDict like;
    like.set("w", ckpt::Tensor(ckpt::DType::float32, {3, 5}));
    like.set("moments.m", ckpt::Tensor(ckpt::DType::float32, {static_cast<std::int64_t>(hi - lo)}));
    return {like, ckpt::PieceMap{{"moments.m", {"moments.m", {rows, 64}, lo}}}};
}

}  // namespace

TEST_CASE("a step saved by 4 ranks loads into 1, 2, 3 or 4 ranks, each reading only the bytes it needs") {
    test::TempDir dir;
    // m: 8 MiB, 2 MiB a piece, chunks of 64 KiB; one rank of 1 reads it all on two threads
    const fs::path index = save_sharded(dir.path(), 4, 32768, 64 << 10);
    CHECK(index == dir.path() / "index-step_7.ckpt");
    const ckpt::GlobalIndex read = ckpt::read_global_index(index);
    CHECK(read.global_step == 7);
    CHECK(read.world_size == 4);
    CHECK(read.pieces.size() == 8);  // every rank's w and its piece of m
    CHECK(read.values.get<std::string>("name") == "rank 0");
    for (const int shards : {1, 2, 3, 4}) {
        for (int j = 0; j < shards; ++j) {
            CAPTURE(shards);
            CAPTURE(j);
            const auto want = wanted(32768, shards, j);
            const auto got = ckpt::load_resharded(index, want.first, want.second);
            const auto piece = fault::ShardLayout{shards}.piece(32768 * 64, j);
            CHECK(got.state.at("moments.m") == ckpt::Value(iota_piece(piece.first, piece.second - piece.first)));
            CHECK(got.state.at("w") == ckpt::Value(iota({3, 5})));
            CHECK(got.state.get<std::int64_t>("trainer.global_step") == 7);
            // aligned pieces read exactly their bytes; others a part of a chunk more at their ends
            const double ratio = double(got.bytes_read) / double(got.bytes_needed);
            CAPTURE(ratio);
            CHECK(ratio <= (shards == 3 ? 1.05 : 1.0));
        }
    }
}

TEST_CASE("a resharding load names what it cannot find, and a damaged chunk by file, tensor and chunk") {
    test::TempDir dir;
    const fs::path index = save_sharded(dir.path(), 2, 512, 16 << 10);  // m: 64 KiB a piece
    SUBCASE("a tensor of another shape") {
        auto want = wanted(512, 1, 0);
        want.second["moments.m"].global_shape = {256, 128};
        CHECK_THROWS_WITH_AS(ckpt::load_resharded(index, want.first, want.second),
                             doctest::Contains("'moments.m' is float32 of shape [512, 64], 'moments.m' wants float32 of shape [256, 128]"),
                             ckpt::LoadMismatch);
    }
    SUBCASE("elements no file holds") {
        auto want = wanted(512, 1, 0);
        want.first.set("moments.m", ckpt::Tensor(ckpt::DType::float32, {512 * 64 + 10}));
        CHECK_THROWS_WITH_AS(ckpt::load_resharded(index, want.first, want.second),
                             doctest::Contains("no rank's file holds elements [32768, 32778) of 'moments.m'"),
                             ckpt::LoadMismatch);
        ckpt::ParamDict extra = wanted(512, 2, 1).first;
        extra.set("bias", ckpt::Tensor(ckpt::DType::float32, {4}));
        CHECK_THROWS_WITH_AS(ckpt::load_resharded(index, extra, wanted(512, 2, 1).second),
                             doctest::Contains("has no tensor 'bias'"), ckpt::LoadMismatch);
    }
    SUBCASE("a bit flipped in rank 1's piece") {
        const auto pieces = ckpt::read_global_index(index).pieces;
        const auto& p = *std::find_if(pieces.begin(), pieces.end(),
                                      [](const ckpt::TensorPiece& x) { return x.rank == 1 && x.global == "moments.m"; });
        test::flip_bit(dir.path() / p.file, p.offset + (16 << 10) + 100);  // in its chunk 1
        const auto whole = wanted(512, 1, 0);
        CHECK_THROWS_WITH_AS(ckpt::load_resharded(index, whole.first, whole.second),
                             doctest::Contains("rank_1/step_7.ckpt': chunk 1 of 'moments.m' (elements [20480, 24576) of "
                                               "'moments.m') does not match its checksum"),
                             ckpt::ChecksumError);
        // rank 0's piece alone is still readable
        const auto first_half = wanted(512, 2, 0);
        CHECK_NOTHROW(ckpt::load_resharded(index, first_half.first, first_half.second));
    }
}

TEST_CASE("files with codecs are indexed too: each is decoded once, its pieces checked in the decoded body") {
    test::TempDir dir;
    std::array<unsigned char, 32> raw{};
    raw.fill(0x5a);
    const ckpt::Key key = ckpt::Key::from_bytes(raw);
    ckpt::SaveOptions save;
    save.codecs = ckpt::Chain<ckpt::Zstd, ckpt::AesGcm>{ckpt::Zstd{1}, ckpt::AesGcm{key}}.codecs();
    ckpt::LoadOptions read;
    read.key = key;
    const fs::path index = save_sharded(dir.path(), 4, 512, 16 << 10, save, read);  // m: 32 KiB a piece
    for (const auto& p : ckpt::read_global_index(index).pieces) CHECK(p.encoded);
    for (const int shards : {1, 3}) {
        for (int j = 0; j < shards; ++j) {
            CAPTURE(shards);
            CAPTURE(j);
            const auto want = wanted(512, shards, j);
            const auto got = ckpt::load_resharded(index, want.first, want.second, read);
            const auto piece = fault::ShardLayout{shards}.piece(512 * 64, j);
            CHECK(got.state.at("moments.m") == ckpt::Value(iota_piece(piece.first, piece.second - piece.first)));
            CHECK(got.state.at("w") == ckpt::Value(iota({3, 5})));
        }
    }
    const auto whole = wanted(512, 1, 0);
    CHECK(ckpt::load_resharded(index, whole.first, whole.second, read).files_opened == 4);  // each once
    CHECK_THROWS_AS(ckpt::load_resharded(index, whole.first, whole.second), ckpt::KeyError);  // no key
}

TEST_CASE("a global index needs every rank's binary file, under its directory") {
    test::TempDir dir;
    ckpt::SaveOptions text;
    text.archive = ckpt::ArchiveKind::text;
    ckpt::save_checkpoint(test::sample_state(), dir / "t.ckpt", text);
    CHECK_THROWS_WITH_AS(ckpt::describe_checkpoint(dir / "t.ckpt", "t.ckpt", 0),
                         doctest::Contains("is not a binary checkpoint"), ckpt::ConfigError);
    ckpt::save_checkpoint(test::sample_state(), dir / "b.ckpt");
    fault::ThreadGroup one(1, std::chrono::seconds(5));
    const auto errors = fault::run_ranks(one, [&](fault::ThreadComm& comm) {
        fault::commit_global_index(comm, dir / "sub", 1, dir / "b.ckpt");
    });
    CHECK(fault::detail::holds<ckpt::ConfigError>(errors[0]));
    CHECK_FALSE(fs::exists(dir / "sub" / "index-step_1.ckpt"));
}

TEST_CASE("training saved with its optimizer state in 4 pieces goes on in 2 or 4 pieces, and on 2 ranks") {
    constexpr int ranks = 4;
    // every rank of a layout trains `epochs`, from the index if given; saves and indexes step 8 when asked
    auto job = [](int world, int shard_size, std::int64_t epochs, const fs::path& from, const fs::path& save_to) {
        test::Params params(static_cast<std::size_t>(world));
        std::vector<ckpt::ParamDict> resumed(static_cast<std::size_t>(world));
        fault::ThreadGroup group(world, std::chrono::seconds(20));
        const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            auto data = test::shard_of(world, comm.rank());  // a global batch of 32 whatever the world size
            nn::UceNet net(7);
            test::DpStack stack(net, comm, shard_size);
            nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
            std::int64_t initial_epoch = 0;
            if (!from.empty()) {
                auto got = ckpt::load_resharded(from, trainer.load_target(), stack.opt().piece_map());
                stack.opt().claim_resharded(got.state);
                const auto rp = trainer.resume_from_state(got.state, from.string(), data);
                stack.opt().set_completed_steps(rp.global_step);
                initial_epoch = rp.initial_epoch;
                resumed[static_cast<std::size_t>(comm.rank())] = got.state;  // its own memory: training does not change it
            }
            struct SaveAt8 {
                fault::ThreadComm& comm;
                fs::path dir;
                fault::ShardLayout layout;
                test::DpOpt& opt;
                void on_step_end(nn::RunContext& c) {
                    if (dir.empty() || c.global_step != 8) return;
                    const fs::path file = dir / ("rank_" + std::to_string(comm.rank())) / "step_8.ckpt";
                    fs::create_directories(file.parent_path());
                    ckpt::SaveOptions o;
                    o.epoch = c.epoch;
                    o.step = c.step;
                    ckpt::save_checkpoint(c.state(), file, o);
                    fault::commit_global_index(comm, dir, 8, file, opt.piece_map(), 64 << 10);
                }
            } save{comm, save_to, fault::ShardLayout{shard_size}, stack.opt()};
            trainer.train(epochs, data, save, initial_epoch);
            params[static_cast<std::size_t>(comm.rank())] = test::flat(net.parameters());
        });
        for (const auto& e : errors) REQUIRE_FALSE(e);
        return std::pair{params, resumed};
    };
    test::TempDir dir;
    const auto straight = job(ranks, 4, 2, {}, dir.path()).first;  // 16 steps; step 8 saved and indexed
    const fs::path index = dir.path() / "index-step_8.ckpt";
    REQUIRE(fs::exists(index));
    // the same world size, the state in 2 pieces: the same sums, the same bits
    const auto two_pieces = job(ranks, 2, 2, index, {}).first;
    for (int r = 0; r < ranks; ++r) CHECK(two_pieces[static_cast<std::size_t>(r)] == straight[0]);
    // 2 ranks: the same samples in the same global batches, the gradients reduced over 2
    // ranks instead of 4 (other sums, so not the same bits): close to the 4-rank run
    const auto two_ranks = job(2, 2, 2, index, {});
    const test::Params& on_two = two_ranks.first;
    const std::vector<ckpt::ParamDict>& states = two_ranks.second;
    CHECK(on_two[0] == on_two[1]);
    REQUIRE(on_two[0].size() == straight[0].size());
    double worst = 0;
    for (std::size_t i = 0; i < on_two[0].size(); ++i) worst = std::max(worst, double(std::abs(on_two[0][i] - straight[0][i])));
    CHECK(worst < 1e-4);
    // the 2 ranks' pieces of the optimizer state at step 8 are the 4 ranks' pieces, joined
    const ckpt::Tensor& m0 = states[0].get<ckpt::Tensor>("moments.layer1.param");
    const ckpt::Tensor& m1 = states[1].get<ckpt::Tensor>("moments.layer1.param");
    std::vector<float> joined;
    for (int r = 0; r < ranks; ++r) {
        const ckpt::ParamDict saved = ckpt::load_checkpoint(dir / ("rank_" + std::to_string(r)) / "step_8.ckpt");
        const auto piece = saved.get<ckpt::Tensor>("moments.layer1.param").values<float>();
        joined.insert(joined.end(), piece.begin(), piece.end());
    }
    std::vector<float> got(m0.values<float>().begin(), m0.values<float>().end());
    got.insert(got.end(), m1.values<float>().begin(), m1.values<float>().end());
    CHECK(got == joined);
}

TEST_CASE("every save of per-rank checkpoints gets a global index, and the indexes of deleted files go") {
    constexpr int ranks = 4;
    test::TempDir dir;
    fault::ThreadGroup group(ranks, std::chrono::seconds(20));
    const auto errors = fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        auto data = test::shard_of(ranks, comm.rank());
        nn::UceNet net(7);
        test::DpStack stack(net, comm, 2);
        nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
        nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast> files(dir / ("rank_" + std::to_string(comm.rank())), "net", {},
                                                                    ckpt::EverySteps{2}, ckpt::KeepLast{2});
        fault::GlobalIndexer indexer(comm, files, dir.path(), [&] { return stack.opt().piece_map(); });
        trainer.train(1, data, nn::callbacks(files, indexer));  // 8 steps: saves at 2, 4, 6, 8
    });
    for (const auto& e : errors) REQUIRE_FALSE(e);
    // KeepLast{2} deleted the files of steps 2 and 4, and their indexes went with them
    const auto indexes = fault::detail::global_indexes(dir.path());
    REQUIRE(indexes.size() == 2);
    CHECK(indexes[0].first == 8);
    CHECK(indexes[1].first == 6);
    const auto latest = fault::latest_global_index(dir.path());
    REQUIRE(latest);
    CHECK(*latest == indexes[0].second);
    const ckpt::GlobalIndex index = ckpt::read_global_index(*latest);
    CHECK(index.world_size == ranks);
    CHECK(index.values.get<std::int64_t>("trainer.global_step") == 8);
    // the momentum of layer1 in 2 pieces, each in the files of the 2 ranks keeping it
    std::vector<std::pair<std::uint64_t, std::int64_t>> pieces;
    for (const auto& p : index.pieces)
        if (p.global == "moments.layer1.param") pieces.emplace_back(p.first, p.rank);
    std::sort(pieces.begin(), pieces.end());
    const std::uint64_t half = 784 * 512 / 2;
    CHECK(pieces == std::vector<std::pair<std::uint64_t, std::int64_t>>{{0, 0}, {0, 2}, {half, 1}, {half, 3}});

    // a damaged chunk in the files of step 8: verifying finds it and takes step 6's index, and
    // a resharding load that meets it falls back to step 6 on every rank, saying why
    std::vector<fs::path> step8;  // every rank's file of step 8
    for (const auto& p : index.pieces)
        if (std::find(step8.begin(), step8.end(), dir.path() / p.file) == step8.end()) step8.push_back(dir.path() / p.file);
    REQUIRE(step8.size() == ranks);
    for (const auto& file : step8) test::flip_bit(file, fs::file_size(file) - 100);
    {
        test::LogCapture log;
        CHECK(fault::latest_global_index(dir.path()) == indexes[1].second);
        CHECK(fault::latest_global_index(dir.path(), /*verify_files=*/false) == indexes[0].second);
        std::vector<std::int64_t> loaded(ranks, -1);
        fault::ThreadGroup again(ranks, std::chrono::seconds(20));
        fault::run_ranks(again, [&](fault::ThreadComm& comm) {
            nn::UceNet net(7);
            test::DpStack stack(net, comm, 2);
            nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
            const auto got = fault::load_latest_resharded(comm, dir.path(), trainer.load_target(), stack.opt().piece_map());
            REQUIRE(got);
            loaded[static_cast<std::size_t>(comm.rank())] = got->global_step;
        }).rethrow();
        CHECK(loaded == std::vector<std::int64_t>(ranks, 6));
        CHECK(std::any_of(log.warnings.begin(), log.warnings.end(), [](const std::string& w) {
            return w.find("global index of step 8 does not load") != std::string::npos;
        }));
    }
    for (const auto& file : step8) test::flip_bit(file, fs::file_size(file) - 100);  // undone, for what follows

    // a file of step 8 gone: the index of step 8 is passed over, step 6's is the newest whole one
    const auto gone = std::find_if(index.pieces.begin(), index.pieces.end(), [](const ckpt::TensorPiece& p) { return p.rank == 3; });
    REQUIRE(gone != index.pieces.end());
    fs::remove(dir.path() / gone->file);
    CHECK(fault::latest_global_index(dir.path()) == indexes[1].second);
    fault::remove_stale_global_indexes(dir.path());
    CHECK_FALSE(fs::exists(indexes[0].second));
    CHECK(fs::exists(indexes[1].second));
}

TEST_CASE("with a durable level, each index follows its ranks' files there, and a lost local level resumes from it") {
    constexpr int ranks = 4;
    // async: each index is committed later, at a poll of the GlobalIndexer's
    for (const bool async : {false, true}) {
        CAPTURE(async);
        test::TempDir local, shared;
        auto rank_dir = [](const fs::path& root, int r) { return root / ("rank_" + std::to_string(r)); };
        fault::ThreadGroup group(ranks, std::chrono::seconds(20));
        fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            auto data = test::shard_of(ranks, comm.rank());
            nn::UceNet net(7);
            test::DpStack stack(net, comm, 2);
            nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
            ckpt::ManagerOptions options;
            // every second save goes to the durable level, which keeps the newest 2 of them
            options.durable = ckpt::DurableLevel{rank_dir(shared.path(), comm.rank()), ckpt::KeepLast{2}, 2};
            options.async_save = async;
            nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast> files(rank_dir(local.path(), comm.rank()), "net", options,
                                                                        ckpt::EverySteps{1}, ckpt::KeepLast{2});
            fault::GlobalIndexer indexer(comm, files, local.path(), [&] { return stack.opt().piece_map(); });
            trainer.train(1, data, nn::callbacks(files, indexer));  // 8 steps, each saved; 2, 4, 6, 8 copied
        }).rethrow();
        // the durable level: the indexes of steps 6 and 8 (its retention deleted 2 and 4 with their files)
        const auto durable = fault::detail::global_indexes(shared.path());
        REQUIRE(durable.size() == 2);
        CHECK(durable[0].first == 8);
        CHECK(durable[1].first == 6);
        CHECK(fault::latest_global_index(shared.path()) == durable[0].second);
        for (int r = 0; r < ranks; ++r)
            CHECK(test::names_in(rank_dir(shared.path(), r)) ==
                  std::vector<std::string>{"net-1_6.ckpt", "net-1_8.ckpt", "net-graph.meta", "net.finished"});

        // the local level of every rank lost: the newest index is the durable one, and it loads on 2 ranks
        fs::remove_all(local.path());
        fs::create_directories(local.path());
        std::vector<std::int64_t> loaded(2, -1);
        fault::ThreadGroup two(2, std::chrono::seconds(20));
        fault::run_ranks(two, [&](fault::ThreadComm& comm) {
            nn::UceNet net(7);
            test::DpStack stack(net, comm, 2);
            nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
            const auto got = fault::load_latest_resharded(comm, {ckpt::Path(local.path()), ckpt::Path(shared.path())},
                                                          trainer.load_target(), stack.opt().piece_map());
            REQUIRE(got);
            CHECK(got->index == durable[0].second);
            loaded[static_cast<std::size_t>(comm.rank())] = got->global_step;
        }).rethrow();
        CHECK(loaded == std::vector<std::int64_t>{8, 8});
    }
}

TEST_CASE("a column-major tensor reshards to a tensor of its order, and is refused by one of the other") {
    test::TempDir dir;
    std::vector<float> values(16);
    std::iota(values.begin(), values.end(), 0.0f);
    ckpt::ParamDict d;
    d.set("square", ckpt::Tensor::from(values, {4, 4}, ckpt::Order::column_major));
    d.set("after", iota({3, 5}));  // its offset counts the storage order record before it
    const fs::path file = dir / "rank_0" / "step_1.ckpt";
    fs::create_directories(file.parent_path());
    ckpt::save_checkpoint(d, file);
    fault::ThreadGroup one(1, std::chrono::seconds(5));
    fs::path index;
    const auto errors = fault::run_ranks(one, [&](fault::ThreadComm& comm) {
        index = fault::commit_global_index(comm, dir.path(), 1, file, {}, 64);
    });
    REQUIRE_FALSE(errors[0]);
    ckpt::ParamDict like;
    like.set("square", ckpt::Tensor(ckpt::DType::float32, {4, 4}, ckpt::Order::column_major));
    like.set("after", ckpt::Tensor(ckpt::DType::float32, {3, 5}));
    const auto got = ckpt::load_resharded(index, like);
    CHECK(got.state.tensor("square") == d.tensor("square"));
    CHECK(got.state.tensor("after") == d.tensor("after"));
    like.set("square", ckpt::Tensor(ckpt::DType::float32, {4, 4}));  // the same stored shape, read as the transpose
    CHECK_THROWS_WITH_AS(ckpt::load_resharded(index, like),
                         doctest::Contains("'square' of 'rank_0/step_1.ckpt' is stored column-major, 'square' is row-major"),
                         ckpt::LoadMismatch);
}

namespace {

/// Every rank of `ranks` saves the same "w", its own "rng" (a per-rank random state) and its
/// own "draws" count, under `dir`, with the places `declared`; the step's index is committed.
void save_per_rank(const fs::path& dir, int ranks, const ckpt::PieceMap& declared) {
    fault::ThreadGroup group(ranks, std::chrono::seconds(10));
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        const std::int64_t r = comm.rank();
        ckpt::ParamDict d;
        d.set("w", iota({2, 3}));
        d.set("rng", ckpt::Tensor::from(std::vector<std::int64_t>{r * 10, r * 10 + 1, r * 10 + 2}));
        d.set("draws", std::int64_t{100 + r});
        const fs::path file = dir / ("rank_" + std::to_string(r)) / "step_5.ckpt";
        fs::create_directories(file.parent_path());
        ckpt::save_checkpoint(d, file);
        fault::commit_global_index(comm, dir, 5, file, declared);
    }).rethrow();
}

std::vector<std::string> errors_of(const std::vector<std::exception_ptr>& errors) {
    std::vector<std::string> out;
    for (const auto& e : errors) out.push_back(ckpt::detail::message_of(e));
    return out;
}

/// A state whose size is known only from the checkpoint: a growing history.
struct History {
    std::vector<double> values;
    std::int64_t steps = 0;
    bool finished = false;
    ckpt::ParamDict state_dict() {
        ckpt::ParamDict d;
        d.set("history", ckpt::view_of(values));
        d.set("steps", ckpt::view_of(steps));
        return d;
    }
    ckpt::ParamDict state_dict_for(const std::vector<ckpt::EntryInfo>& entries) {
        for (const auto& e : entries)
            if (e.name == "history" && e.kind == ckpt::ValueKind::tensor && e.shape.size() == 1)
                values.resize(static_cast<std::size_t>(e.shape[0]));
        return state_dict();
    }
    void loaded(const ckpt::LoadReport&) { finished = true; }
};

}  // namespace

TEST_CASE("an entry left out of the PieceMap that differs between the ranks is refused, naming it and the ranks") {
    test::TempDir dir;
    save_per_rank(dir.path(), 4, {});
    auto like = [] {
        ckpt::ParamDict d;
        d.set("w", ckpt::Tensor(ckpt::DType::float32, {2, 3}));
        d.set("rng", ckpt::Tensor(ckpt::DType::int64, {3}));
        return d;
    };
    fault::ThreadGroup four(4, std::chrono::seconds(10));
    const auto errors = errors_of(fault::run_ranks(four, [&](fault::ThreadComm& comm) {
        fault::load_latest_resharded(comm, dir.path(), like());
    }));
    // every rank refuses, as it would have loaded rank 0's copy
    for (const auto& e : errors)
        CHECK(e.find("entry 'rng' differs between the ranks that saved it: rank(s) 1, 2, 3 hold other values than rank 0") !=
              std::string::npos);
    // declared per-rank by the loader, each rank takes its own copy, and its own value
    const ckpt::PieceMap mine{{"rng", ckpt::PiecePlace::per_rank()}, {"draws", ckpt::PiecePlace::per_rank()}};
    fault::ThreadGroup again(4, std::chrono::seconds(10));  // the first group's ranks ended with an error
    fault::run_ranks(again, [&](fault::ThreadComm& comm) {
        const auto got = fault::load_latest_resharded(comm, dir.path(), like(), mine);
        REQUIRE(got);
        const auto rng = got->state.state.tensor("rng").values<std::int64_t>();
        CHECK(std::vector<std::int64_t>(rng.begin(), rng.end()) ==
              std::vector<std::int64_t>{comm.rank() * 10, comm.rank() * 10 + 1, comm.rank() * 10 + 2});
        CHECK(got->state.state.get<std::int64_t>("draws") == 100 + comm.rank());
    }).rethrow();
}

TEST_CASE("per-rank entries declared when saving load as each rank's own, and a rank that saved none is told so") {
    test::TempDir dir;
    save_per_rank(dir.path(), 2, {{"rng", ckpt::PiecePlace::per_rank()}, {"draws", ckpt::PiecePlace::per_rank()}});
    ckpt::ParamDict like;
    like.set("w", ckpt::Tensor(ckpt::DType::float32, {2, 3}));
    like.set("rng", ckpt::Tensor(ckpt::DType::int64, {3}));
    const auto index = dir.path() / "index-step_5.ckpt";
    CHECK(ckpt::read_global_index(index).copies.at("rng") == ckpt::Copies::per_rank);
    const auto second = ckpt::load_resharded(index, like, {}, {}, 1);
    CHECK(second.state.tensor("rng").values<std::int64_t>()[0] == 10);
    CHECK(second.state.get<std::int64_t>("draws") == 101);
    CHECK_THROWS_WITH_AS(ckpt::load_resharded(index, like, {}, {}, 2),
                         doctest::Contains("entry 'rng' is per-rank, and rank 2 saved none"), ckpt::LoadMismatch);
    CHECK_THROWS_WITH_AS(ckpt::load_resharded(index, like), doctest::Contains("pass the loading rank"), ckpt::ConfigError);
    // declared replicated, any copy serves: the lowest rank's
    const auto any = ckpt::load_resharded(index, like, {{"rng", ckpt::PiecePlace::replicated()}}, {}, 1);
    CHECK(any.state.tensor("rng").values<std::int64_t>()[0] == 0);
}

TEST_CASE("a row block of a column-major matrix is refused when indexed, with the way out, and column blocks are not") {
    test::TempDir dir;
    // rank 1's rows [2, 4) of a [4, 3] column-major matrix: stored as its transpose [3, 2]
    ckpt::ParamDict d;
    d.set("u", ckpt::Tensor(ckpt::DType::float64, {2, 3}, ckpt::Order::column_major));
    const fs::path file = dir / "rank_0" / "step_1.ckpt";
    fs::create_directories(file.parent_path());
    ckpt::save_checkpoint(d, file);
    for (const ckpt::PiecePlace& place : {ckpt::PiecePlace{"u", {3, 4}, 2}, ckpt::PiecePlace{"u", {4, 3}, 6}}) {
        CHECK_THROWS_WITH_AS(ckpt::describe_checkpoint(file, "rank_0/step_1.ckpt", 1, {{"u", place}}),
                             doctest::Contains("is a [2, 3] block held column-major (stored as its transpose [3, 2])"),
                             ckpt::ConfigError);
        CHECK_THROWS_WITH_AS(ckpt::describe_checkpoint(file, "rank_0/step_1.ckpt", 1, {{"u", place}}),
                             doctest::Contains("blocks of whole columns"), ckpt::ConfigError);
    }
    // columns [1, 3) of a [2, 5] column-major matrix: rows of its stored form [5, 2]
    CHECK_NOTHROW(ckpt::describe_checkpoint(file, "rank_0/step_1.ckpt", 1, {{"u", ckpt::PiecePlace{"u", {5, 2}, 2}}}));
}

TEST_CASE("load_latest_resharded shapes a target after the index, and a second part loads from the same step") {
    test::TempDir dir;
    fault::ThreadGroup two(2, std::chrono::seconds(10));
    // a history of 37 values, grown during the run: the same on both ranks
    fault::run_ranks(two, [&](fault::ThreadComm& comm) {
        History h;
        h.values.resize(37);
        std::iota(h.values.begin(), h.values.end(), 0.5);
        h.steps = 37;
        const fs::path file = dir / ("rank_" + std::to_string(comm.rank())) / "step_37.ckpt";
        fs::create_directories(file.parent_path());
        ckpt::save_checkpoint(h.state_dict(), file);
        fault::commit_global_index(comm, dir.path(), 37, file);
    }).rethrow();
    fault::ThreadGroup three(3, std::chrono::seconds(10));
    fault::run_ranks(three, [&](fault::ThreadComm& comm) {
        History h;  // empty: its size comes from the checkpoint
        const auto resumed = fault::load_latest_resharded(comm, dir.path(), h);
        REQUIRE(resumed);
        CHECK(h.finished);
        CHECK(h.steps == 37);
        REQUIRE(h.values.size() == 37);
        CHECK(h.values[36] == 36.5);
        // a second part of the state, pinned to the step the first part came from
        History again;
        ckpt::load_resharded_into(resumed->index, again, {}, {}, comm.rank());
        CHECK(again.values == h.values);
    }).rethrow();
}

TEST_CASE("a retention of one file keeps each rank's file of the newest committed index until the next is committed") {
    test::TempDir dir;
    fault::ThreadGroup two(2, std::chrono::seconds(10));
    fault::run_ranks(two, [&](fault::ThreadComm& comm) {
        std::vector<float> w(16, 0.0f);
        ckpt::ParamDict state;
        state.set("w", ckpt::view_of(w));
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(
            dir / ("rank_" + std::to_string(comm.rank())), "net", ckpt::EverySteps{1}, ckpt::KeepLast{1});
        for (std::int64_t s = 1; s <= 4; ++s) {
            std::fill(w.begin(), w.end(), static_cast<float>(s));
            const auto file = mgr.on_step(ckpt::Progress::at_iteration(s), state);
            REQUIRE(file);
            // step 4 is saved, and the job dies before its index is committed
            if (s < 4) fault::index_saved_checkpoint(comm, mgr, dir.path(), s, *file);
        }
    }).rethrow();
    // KeepLast{1} deleted step 3's files at step 4's save, but for the index that names them
    const auto whole = fault::latest_global_index(dir.path());
    REQUIRE(whole);
    CHECK(whole->filename() == "index-step_3.ckpt");
    CHECK(fs::exists(dir / "rank_0" / "net-3.ckpt"));
    CHECK(fs::exists(dir / "rank_1" / "net-4.ckpt"));
}

TEST_CASE("async saves commit their global index later, keeping a pending step's files, and never an index that is not whole") {
    test::TempDir dir;
    std::vector<std::optional<std::int64_t>> pending(2);
    fault::ThreadGroup two(2, std::chrono::seconds(20));
    fault::run_ranks(two, [&](fault::ThreadComm& comm) {
        std::vector<float> w(1 << 16, 0.0f);  // 256 KiB: each write outlasts the calls that follow it
        std::int64_t step = 0;
        ckpt::ParamDict state;
        state.set("w", ckpt::view_of(w));
        state.set("step", ckpt::view_of(step));
        ckpt::ManagerOptions async;
        async.async_save = true;
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(
            dir / ("rank_" + std::to_string(comm.rank())), "net", ckpt::EverySteps{1}, ckpt::KeepLast{1}, {}, async);
        fault::IndexCommitter commits(comm, mgr, dir.path());
        // a save every step, no poll between: each index is committed at the next save, after
        // that save's write may have applied KeepLast{1}
        for (step = 1; step <= 4; ++step) {
            std::fill(w.begin(), w.end(), static_cast<float>(step));
            const auto file = mgr.on_step(ckpt::Progress::at_iteration(step), state);
            REQUIRE(file);
            mgr.wait_for(*file);  // its retention has run before the pending step's index is committed
            const auto committed = commits.saved(step, *file);
            CHECK(commits.pending_step() == step);
            CHECK(committed.has_value() == (step > 1));
            if (committed) CHECK(committed->filename() == "index-step_" + std::to_string(step - 1) + ".ckpt");
            if (committed && comm.rank() == 0 && step > 2) {
                // the index committed at the save before is written by now (rank 0 said so in
                // this call's exchange), and whole: the files it names were held while it was pending
                const auto before = fault::global_index_path(dir.path(), step - 2);
                CHECK(fs::exists(before));
                CHECK_FALSE(fault::detail::global_index_files_problem(before));
            }
            comm.barrier();  // rank 0's check before either goes on
        }
        // step 4's index comes from poll() alone, once both files are described
        std::optional<fs::path> committed;
        for (int polls = 0; polls < 4096 && !committed; ++polls) {
            committed = commits.poll();
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        REQUIRE(committed);
        CHECK(committed->filename() == "index-step_4.ckpt");
        pending[static_cast<std::size_t>(comm.rank())] = commits.pending_step();
        CHECK_FALSE(commits.finish());  // nothing left to commit; rank 0's write is waited for
    }).rethrow();
    CHECK(pending == std::vector<std::optional<std::int64_t>>(2));
    CHECK(fault::latest_global_index(dir.path()) == fault::global_index_path(dir.path(), 4));
    // what the index of step 4 names loads, as saved
    fault::ThreadGroup again(2, std::chrono::seconds(20));
    fault::run_ranks(again, [&](fault::ThreadComm& comm) {
        std::vector<float> w(1 << 16, 0.0f);
        std::int64_t step = 0;
        ckpt::ParamDict state;
        state.set("w", ckpt::view_of(w));
        state.set("step", ckpt::view_of(step));
        const auto got = fault::load_latest_resharded(comm, dir.path(), state);
        REQUIRE(got);
        ckpt::load_param_into_net(state, got->state.state, /*strict=*/true);
        CHECK(step == 4);
        CHECK(std::all_of(w.begin(), w.end(), [](float v) { return v == 4.0f; }));
    }).rethrow();
}

TEST_CASE("a rank whose async save fails gives up the step's index on every rank, naming it, and its manager says why") {
    test::TempDir dir;
    test::LogCapture log;
    fault::ThreadGroup two(2, std::chrono::seconds(20));
    fault::run_ranks(two, [&](fault::ThreadComm& comm) {
        std::vector<float> w(64, 1.0f);
        ckpt::ParamDict state;
        state.set("w", ckpt::view_of(w));
        ckpt::ManagerOptions async;
        async.async_save = true;
        const fs::path mine = dir / ("rank_" + std::to_string(comm.rank()));
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(
            mine, "net", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, async);
        fault::IndexCommitter commits(comm, mgr, dir.path());
        commits.saved(1, *mgr.on_step(ckpt::Progress::at_iteration(1), state));
        REQUIRE(commits.finish());
        // rank 1's file of step 2 cannot take its name: a directory is in the way
        if (comm.rank() == 1) fs::create_directories(mine / "net-2.ckpt" / "in_the_way");
        comm.barrier();
        commits.saved(2, *mgr.on_step(ckpt::Progress::at_iteration(2), state));
        CHECK_FALSE(commits.finish());
        CHECK_FALSE(commits.pending_step());
        if (comm.rank() == 1) CHECK_THROWS_AS(mgr.wait(), ckpt::IoError);
        else CHECK_NOTHROW(mgr.wait());
        // rank 0 cannot write the index of step 3 (a directory is in the way): every rank hears
        // of it at the next exchange, and the index of step 1 stays the newest
        if (comm.rank() == 0) fs::create_directories(fault::global_index_path(dir.path(), 3) / "in_the_way");
        comm.barrier();
        commits.saved(3, *mgr.on_step(ckpt::Progress::at_iteration(3), state));
        CHECK(commits.finish() == fault::global_index_path(dir.path(), 3));
        CHECK(commits.last_index() == fault::global_index_path(dir.path(), 1));
    }).rethrow();
    const auto latest = fault::latest_global_index(dir.path());
    REQUIRE(latest);
    CHECK(latest->filename() == "index-step_1.ckpt");
    CHECK_FALSE(fs::exists(fault::global_index_path(dir.path(), 2)));
    CHECK(std::count_if(log.warnings.begin(), log.warnings.end(), [](const std::string& w) {
              return w.find("index-step_3.ckpt' could not be written") != std::string::npos;
          }) == 2);
    const auto said = std::count_if(log.warnings.begin(), log.warnings.end(), [](const std::string& w) {
        return w.find("global index of step 2") != std::string::npos && w.find("the save of rank(s) 1 failed") != std::string::npos;
    });
    CHECK(said == 2);  // on each rank

    // a manager saving outside the index's directory is a misuse: every rank stops, as with
    // synchronous saves, rather than train on with steps that are never saved
    test::TempDir elsewhere;
    fault::ThreadGroup again(2, std::chrono::seconds(20));
    const auto errors = fault::run_ranks(again, [&](fault::ThreadComm& comm) {
        std::vector<float> w(64, 1.0f);
        ckpt::ParamDict state;
        state.set("w", ckpt::view_of(w));
        ckpt::ManagerOptions async;
        async.async_save = true;
        ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> mgr(
            elsewhere / ("rank_" + std::to_string(comm.rank())), "net", ckpt::EverySteps{1}, ckpt::KeepLast{2}, {}, async);
        fault::IndexCommitter commits(comm, mgr, dir.path());
        commits.saved(1, *mgr.on_step(ckpt::Progress::at_iteration(1), state));
        commits.finish();
    });
    for (const auto& e : errors) {
        REQUIRE(e);
        CHECK_THROWS_WITH_AS(std::rethrow_exception(e), doctest::Contains("is not under"), ckpt::ConfigError);
    }
}

namespace {

/// A state of shared tensors of awkward sizes (rows that a cut falls inside, a column-major
/// matrix, a scalar, an empty tensor) and entries that are not shared.
ckpt::ParamDict mixed_state() {
    ckpt::ParamDict d;
    d.set("a", iota({100, 7}));
    std::vector<double> b(3, 2.5), col(24);
    std::iota(col.begin(), col.end(), 100.0);
    d.set("b", ckpt::Tensor::from(b));
    d.set("cm", ckpt::Tensor::from(col, {6, 4}, ckpt::Order::column_major));
    d.set("s", ckpt::Tensor::from(std::vector<float>{7}, {}));
    d.set("empty", ckpt::Tensor(ckpt::DType::float32, {0, 3}));
    d.set("z", iota({1000}, 5));
    d.set("rng", iota({4}, 9));           // per-rank
    d.set("moments.m", iota({10}, 50));   // a piece of sharded state
    d.set("name", std::string("job"));
    return d;
}

}  // namespace

TEST_CASE("replica shares cut the shared tensors at rows into runs of nearly equal bytes, each byte in one share") {
    const ckpt::ParamDict state = mixed_state();
    const ckpt::PieceMap declared{{"rng", ckpt::PiecePlace::per_rank()}, {"moments.m", {"moments.m", {40}, 10}}};
    for (const int replicas : {1, 2, 3, 4, 7}) {
        CAPTURE(replicas);
        std::map<std::string, std::vector<int>> hits;  // per shared tensor, how many shares hold each byte
        std::map<std::string, std::vector<std::byte>> rebuilt;
        std::uint64_t most = 0, least = UINT64_MAX, total = 0;
        for (int k = 0; k < replicas; ++k) {
            const fault::ReplicaShare share = fault::replica_share(state, replicas, k, declared);
            CHECK(share.shared_bytes == 2800 + 24 + 192 + 4 + 4000);
            // what is not shared is in every share, whole
            CHECK(share.state.at("rng") == state.at("rng"));
            CHECK(share.state.at("moments.m") == state.at("moments.m"));
            CHECK(share.state.get<std::string>("name") == "job");
            CHECK_FALSE(share.places.contains("rng"));
            for (const auto& [name, value] : share.state) {
                if (name == "rng" || name == "moments.m" || !value.get_if<ckpt::Tensor>()) continue;
                const ckpt::Tensor& whole = state.tensor(name);
                const ckpt::Tensor& part = *value.get_if<ckpt::Tensor>();
                CHECK(part.dtype() == whole.dtype());
                CHECK(part.order() == whole.order());
                std::uint64_t first = 0;  // elements
                if (const auto it = share.places.find(name); it != share.places.end()) {
                    CHECK(it->second.global == name);
                    CHECK(it->second.global_shape == whole.shape());
                    first = it->second.first;
                } else {
                    CHECK(part.nbytes() == whole.nbytes());
                }
                auto& h = hits[name];
                auto& bytes = rebuilt[name];
                h.resize(whole.nbytes());
                bytes.resize(whole.nbytes());
                const std::uint64_t at = first * ckpt::itemsize(whole.dtype());
                REQUIRE(at + part.nbytes() <= whole.nbytes());
                std::copy_n(part.data(), part.nbytes(), bytes.begin() + static_cast<std::ptrdiff_t>(at));
                for (std::uint64_t i = 0; i < part.nbytes(); ++i) ++h[at + i];
            }
            most = std::max(most, share.own_bytes);
            least = std::min(least, share.own_bytes);
            total += share.own_bytes;
            // the same split whenever it is asked for
            CHECK(fault::replica_share(state, replicas, k, declared).places == share.places);
        }
        CHECK(total == 7020 + 40 * replicas);  // the shared bytes once, the piece (a group of one each) whole
        // nearly equal: within a row (28 bytes of "a", 16 of "z") of the mean at each cut
        CHECK(most - least <= 2 * 28);
        for (const char* name : {"a", "b", "cm", "s", "z"}) {
            CAPTURE(name);
            const ckpt::Tensor& whole = state.tensor(name);
            REQUIRE(hits[name].size() == whole.nbytes());
            CHECK(std::all_of(hits[name].begin(), hits[name].end(), [](int n) { return n == 1; }));
            CHECK(std::equal(rebuilt[name].begin(), rebuilt[name].end(), whole.data()));
        }
    }
    CHECK_THROWS_AS(fault::replica_share(state, 2, 2), ckpt::ConfigError);
    CHECK_THROWS_AS(fault::replica_share(state, 2, 0, declared, {3, 0}), ckpt::ConfigError);
    CHECK_THROWS_AS(fault::replica_share(state, 4, 0, declared, {2, 2}), ckpt::ConfigError);
}

TEST_CASE("the pieces of sharded state are cut among the members of their replica group, each element in one share") {
    const ckpt::ParamDict state = mixed_state();
    // "moments.m" is elements [10, 20) of a global tensor of 40 x 2
    const ckpt::PieceMap declared{{"rng", ckpt::PiecePlace::per_rank()}, {"moments.m", {"moments.g", {40, 2}, 10}}};
    for (const int members : {1, 2, 3}) {
        CAPTURE(members);
        std::vector<int> hits(80);
        std::vector<float> rebuilt(80);
        for (int k = 0; k < members; ++k) {
            // the shared tensors are cut among all 6 replicas whatever the group
            const fault::ReplicaShare share = fault::replica_share(state, 6, k, declared, {members, k});
            CHECK(share.shared_bytes == 7020);
            CHECK(share.group_bytes == 40);
            CHECK(share.places == fault::replica_share(state, 6, k, declared, {members, k}).places);
            CHECK(share.state.at("rng") == state.at("rng"));
            if (!share.state.contains("moments.m")) continue;
            const auto part = share.state.tensor("moments.m").values<float>();
            std::uint64_t first = 10;
            if (const auto it = share.places.find("moments.m"); it != share.places.end()) {
                CHECK(it->second.global == "moments.g");
                CHECK(it->second.global_shape == ckpt::Shape{40, 2});
                CHECK(it->second.copies == ckpt::Copies::same);
                first = it->second.first;
            } else {
                CHECK(part.size() == 10);
            }
            REQUIRE(first + part.size() <= 80);
            for (std::size_t i = 0; i < part.size(); ++i) {
                ++hits[first + i];
                rebuilt[first + i] = part[i];
            }
        }
        const auto whole = state.tensor("moments.m").values<float>();
        for (std::size_t i = 0; i < 80; ++i) CHECK(hits[i] == (i >= 10 && i < 20 ? 1 : 0));
        CHECK(std::equal(whole.begin(), whole.end(), rebuilt.begin() + 10));
    }
}

TEST_CASE("a data-parallel job saves replica-parallel, each byte once, and resumes from the index on 4 or 2 ranks") {
    constexpr int ranks = 4;
    // 1: every rank holds all the state; 2: the momentum in 2 pieces, each kept by 2 ranks
    for (const int shard_size : {1, 2}) {
        CAPTURE(shard_size);
        test::TempDir dir;
        using Files = nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast>;
        // trains `epochs` on `world` ranks, from the newest index when there is one; saves every 4 steps
        auto job = [&](int world, std::int64_t epochs) {
            test::Params params(static_cast<std::size_t>(world));
            std::vector<std::uint64_t> own(static_cast<std::size_t>(world));
            fault::ThreadGroup group(world, std::chrono::seconds(20));
            fault::run_ranks(group, [&](fault::ThreadComm& comm) {
                auto data = test::shard_of(world, comm.rank());
                nn::UceNet net(7);
                test::DpStack stack(net, comm, shard_size);
                nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
                std::int64_t initial_epoch = 0;
                if (auto got = fault::load_latest_resharded(comm, dir.path(), trainer.load_target(), stack.opt().piece_map())) {
                    stack.opt().claim_resharded(got->state.state);
                    const auto rp = trainer.resume_from_state(got->state.state, got->index.string(), data);
                    stack.opt().set_completed_steps(rp.global_step);
                    initial_epoch = rp.initial_epoch;
                }
                Files files(dir / ("rank_" + std::to_string(comm.rank())), "net", {}, ckpt::EverySteps{4}, ckpt::KeepLast{1});
                fault::ReplicaParallel shared(comm, files, [&] { return stack.opt().piece_map(); });
                fault::GlobalIndexer indexer(comm, shared, dir.path(), [&] { return shared.piece_map(); });
                trainer.train(epochs, data, nn::callbacks(shared, indexer), initial_epoch);
                params[static_cast<std::size_t>(comm.rank())] = test::flat(net.parameters());
                own[static_cast<std::size_t>(comm.rank())] = shared.own_bytes();
            }).rethrow();
            return std::pair{params, own};
        };
        const auto [straight, own] = job(ranks, 2);  // 16 steps, saved at 4, 8, 12, 16
        const fs::path index = dir.path() / "index-step_16.ckpt";
        REQUIRE(fs::exists(index));
        {
            // each rank wrote a quarter of the parameters and the momentum: their bytes once in all
            const ckpt::GlobalIndex read = ckpt::read_global_index(index);
            std::map<std::string, std::uint64_t> tensors;  // each global tensor's bytes
            std::set<std::string> files;
            for (const auto& p : read.pieces) {
                tensors[p.global] = ckpt::detail::numel_of(p.global_shape) * ckpt::itemsize(p.dtype);
                files.insert(p.file);
            }
            std::uint64_t model = 0, written = 0;
            for (const auto& [name, bytes] : tensors) model += bytes;
            for (const auto& f : files) written += fs::file_size(dir / f);
            CAPTURE(written);
            CAPTURE(model);
            CHECK(files.size() == ranks);
            CHECK(double(written) / double(model) < 1.01);
            for (const std::uint64_t mine : own) CHECK(std::llabs(std::int64_t(mine) - std::int64_t(model / ranks)) < 4096);
            // sharded, each piece of the momentum is written once, cut between the 2 ranks keeping it
            std::vector<std::pair<std::uint64_t, std::int64_t>> pieces;
            for (const auto& p : read.pieces)
                if (p.global == "moments.layer1.param") pieces.emplace_back(p.first, p.rank);
            std::sort(pieces.begin(), pieces.end());
            if (shard_size == 2) {
                REQUIRE(pieces.size() == 4);
                CHECK(pieces[0] == std::pair<std::uint64_t, std::int64_t>{0, 0});
                CHECK(pieces[1].second == 2);
                CHECK(pieces[1].first > 0);
                CHECK(pieces[2] == std::pair<std::uint64_t, std::int64_t>{784 * 512 / 2, 1});
                CHECK(pieces[3].second == 3);
                CHECK(pieces[3].first > 784 * 512 / 2);
            }
        }
        // on 2 ranks: each loads the whole state of step 16, bit for bit the 4 ranks' parameters,
        // each reading half of it from the files and the other half from the other rank
        test::Params on_two(2);
        std::vector<std::uint64_t> read(2), needed(2);
        fault::ThreadGroup two(2, std::chrono::seconds(20));
        fault::run_ranks(two, [&](fault::ThreadComm& comm) {
            auto data = test::shard_of(2, comm.rank());
            nn::UceNet net(3);
            test::DpStack stack(net, comm, 1);
            nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
            auto got = fault::load_latest_resharded(comm, dir.path(), trainer.load_target(), stack.opt().piece_map());
            REQUIRE(got);
            CHECK(got->global_step == 16);
            read[static_cast<std::size_t>(comm.rank())] = got->state.bytes_read;
            needed[static_cast<std::size_t>(comm.rank())] = got->state.bytes_needed;
            stack.opt().claim_resharded(got->state.state);
            trainer.resume_from_state(got->state.state, got->index.string(), data);
            on_two[static_cast<std::size_t>(comm.rank())] = test::flat(net.parameters());
        }).rethrow();
        CHECK(on_two[0] == straight[0]);
        CHECK(on_two[1] == straight[0]);
        CHECK(needed[0] == needed[1]);
        CAPTURE(read[0]);
        CAPTURE(read[1]);
        CHECK(std::llabs(std::int64_t(read[0]) - std::int64_t(needed[0] / 2)) < 4096);
        CHECK(std::llabs(std::int64_t(read[1]) - std::int64_t(needed[0] / 2)) < 4096);
        // a rank that cannot reach the files (its view of the directory gone) loads too: the index
        // and the state from the other
        fault::run_ranks(two, [&](fault::ThreadComm& comm) {
            auto data = test::shard_of(2, comm.rank());
            nn::UceNet net(3);
            test::DpStack stack(net, comm, 1);
            nn::Trainer<nn::UceNet, test::DpOpt> trainer(net, stack.opt(), {}, comm.rank());
            const fs::path where = comm.rank() == 1 ? dir / "gone" : dir.path();
            auto got = fault::load_latest_resharded(comm, where, trainer.load_target(), stack.opt().piece_map());
            REQUIRE(got);
            CHECK(got->global_step == 16);
            read[static_cast<std::size_t>(comm.rank())] = got->state.bytes_read;
            stack.opt().claim_resharded(got->state.state);
            trainer.resume_from_state(got->state.state, got->index.string(), data);
            on_two[static_cast<std::size_t>(comm.rank())] = test::flat(net.parameters());
        }).rethrow();
        CHECK(on_two[0] == straight[0]);
        CHECK(on_two[1] == straight[0]);
        CHECK(read[0] >= needed[0]);
        CHECK(read[1] == 0);
        // a rank's file is a share: a trainer resuming from it alone is told how to load the step
        {
            nn::UceNet net(3);
            nn::Momentum momentum(net.parameters(), 0.01, 0.9);
            nn::Trainer<nn::UceNet, nn::Momentum> alone(net, momentum);
            auto data = test::shard_of(1, 0);
            CHECK_THROWS_WITH_AS(alone.resume_from(*ckpt::latest(dir / "rank_1", "net"), data),
                                 doctest::Contains("The file is rank 1 of 4's share of global step 16"), ckpt::LoadMismatch);
        }
        // the same job stopped after step 8, then resumed from its index: the same bits
        for (const auto& f : fs::directory_iterator(dir.path())) fs::remove_all(f.path());
        job(ranks, 1);
        const auto resumed = job(ranks, 2).first;
        for (int r = 0; r < ranks; ++r) CHECK(resumed[static_cast<std::size_t>(r)] == straight[0]);
    }
}

TEST_CASE("an index whose pieces leave a tensor's elements in no file is refused on every rank, and not written") {
    constexpr int ranks = 3;
    test::TempDir dir;
    std::vector<std::string> refused(ranks);
    fault::ThreadGroup group(ranks, std::chrono::seconds(10));
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        ckpt::ParamDict d;
        d.set("w", iota({30, 4}));
        // rank 2 takes the last of 4 runs (rows 23 to 30), where the others take 2 of 3: rows
        // 20 to 23 are in no file
        const fault::ReplicaShare share =
            comm.rank() == 2 ? fault::replica_share(d, 4, 3) : fault::replica_share(d, ranks, comm.rank());
        const fs::path file = dir / ("rank_" + std::to_string(comm.rank())) / "step_1.ckpt";
        fs::create_directories(file.parent_path());
        ckpt::save_checkpoint(share.state, file);
        try {
            fault::commit_global_index(comm, dir.path(), 1, file, share.places);
        } catch (const ckpt::ConfigError& e) {
            refused[static_cast<std::size_t>(comm.rank())] = e.what();
        }
    }).rethrow();
    for (const auto& why : refused) {
        CHECK(why.find("global index of step 1") != std::string::npos);
        CHECK(why.find("no rank's file holds elements [80, 92) of 'w' (120 elements)") != std::string::npos);
    }
    CHECK_FALSE(fs::exists(dir.path() / "index-step_1.ckpt"));
}

TEST_CASE("a replica-parallel save finds the replica groups of sharded state, and refuses a piece that differs in one") {
    constexpr int ranks = 4;
    for (const bool differ : {false, true}) {
        CAPTURE(differ);
        test::TempDir dir;
        std::vector<std::string> refused(ranks);
        std::vector<std::vector<int>> groups(ranks);
        fault::ThreadGroup group(ranks, std::chrono::seconds(10));
        fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            // "m" in 2 pieces of 6 elements: ranks 0 and 2 keep the first, 1 and 3 the second
            const int piece = comm.rank() % 2;
            ckpt::Tensor w = iota({40, 4}), m = iota({6}, static_cast<float>(6 * piece + (differ && comm.rank() == 3)));
            nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast> files(dir / ("rank_" + std::to_string(comm.rank())),
                                                                        "net", {}, ckpt::EverySteps{1});
            const ckpt::PieceMap pieces{{"m", {"m", {12}, static_cast<std::uint64_t>(6 * piece)}}};
            fault::ReplicaParallel shared(comm, files, [&] { return pieces; });
            nn::RunContext ctx = step_context(1, [&] { return ckpt::ParamDict{{"w", w}, {"m", m}}; });
            try {
                shared.on_step_end(ctx);
                fault::commit_global_index(comm, dir.path(), 1, *shared.last_saved(), shared.piece_map());
            } catch (const ckpt::ConfigError& e) {
                refused[static_cast<std::size_t>(comm.rank())] = e.what();
            }
            groups[static_cast<std::size_t>(comm.rank())] = shared.replica_group();
        }).rethrow();
        CHECK(groups == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {0, 2}, {1, 3}});
        for (const auto& why : refused) {
            CAPTURE(why);
            CHECK(why.empty() == !differ);
            if (differ)
                CHECK(why.find("replica-parallel save of global step 1: rank(s) 3 hold other values than rank 1, of their "
                               "replica group, for ") != std::string::npos);
        }
        CHECK(fs::exists(dir.path() / "index-step_1.ckpt") == !differ);
        if (differ) continue;
        // each piece once: 3 elements from each rank of its group
        const ckpt::GlobalIndex index = ckpt::read_global_index(dir.path() / "index-step_1.ckpt");
        std::vector<std::pair<std::uint64_t, std::int64_t>> m;
        for (const auto& p : index.pieces)
            if (p.global == "m") m.emplace_back(p.first, p.rank);
        std::sort(m.begin(), m.end());
        CHECK(m == std::vector<std::pair<std::uint64_t, std::int64_t>>{{0, 0}, {3, 2}, {6, 1}, {9, 3}});
        const ckpt::ParamDict like{{"m", ckpt::Tensor(ckpt::DType::float32, {12})}};
        CHECK(ckpt::load_resharded(dir.path() / "index-step_1.ckpt", like).state.at("m") == ckpt::Value(iota({12})));
    }
}

TEST_CASE("a replica-parallel save refuses a tensor that differs between the ranks unless it is declared per-rank") {
    constexpr int ranks = 3;
    for (const bool declared : {false, true}) {
        CAPTURE(declared);
        test::TempDir dir;
        std::vector<std::string> refused(ranks);
        fault::ThreadGroup group(ranks, std::chrono::seconds(10));
        fault::run_ranks(group, [&](fault::ThreadComm& comm) {
            ckpt::Tensor w = iota({40, 4}), rng = iota({8}, static_cast<float>(comm.rank()));
            nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast> files(dir / ("rank_" + std::to_string(comm.rank())),
                                                                        "net", {}, ckpt::EverySteps{1});
            fault::ReplicaParallel shared(comm, files, [&] {
                return declared ? ckpt::PieceMap{{"rng", ckpt::PiecePlace::per_rank()}} : ckpt::PieceMap{};
            });
            nn::RunContext ctx = step_context(1, [&] { return ckpt::ParamDict{{"w", w}, {"rng", rng}}; });
            try {
                shared.on_step_end(ctx);
                fault::commit_global_index(comm, dir.path(), 1, *shared.last_saved(), shared.piece_map());
            } catch (const ckpt::ConfigError& e) {
                refused[static_cast<std::size_t>(comm.rank())] = e.what();
            }
            CHECK(ctx.state().contains("w"));  // the wrapped state is the whole one again
            CHECK(ctx.state().tensor("w").nbytes() == 640);
        }).rethrow();
        for (const auto& why : refused) {
            CAPTURE(why);
            CHECK(why.empty() == declared);
            if (!declared)
                CHECK(why.find("replica-parallel save of global step 1: rank(s) 1, 2 hold other values than rank 0 for "
                               "'rng'") != std::string::npos);
        }
        CHECK(fs::exists(dir.path() / "index-step_1.ckpt") == declared);
    }
}

namespace {

/// A ThreadComm whose allgathers of more than 1 KiB arrive at rank `victim` with one bit flipped,
/// in byte `at`.
struct CorruptingComm {
    fault::ThreadComm& comm;
    int victim;
    std::size_t at = 100;
    int rank() const { return comm.rank(); }
    int size() const { return comm.size(); }
    void allreduce(std::span<float> d, fault::ReduceOp op) { comm.allreduce(d, op); }
    void broadcast(std::span<float> d, int root) { comm.broadcast(d, root); }
    void allgather(std::span<const float> in, std::span<float> out) {
        comm.allgather(in, out);
        if (comm.rank() == victim && out.size_bytes() > 1024) reinterpret_cast<unsigned char*>(out.data())[at] ^= 1;
    }
    void barrier() { comm.barrier(); }
    void send(std::span<const float> d, int peer, int tag) { comm.send(d, peer, tag); }
    void recv(std::span<float> d, int peer, int tag) { comm.recv(d, peer, tag); }
};

}  // namespace

TEST_CASE("a load on several ranks reads each byte of what they load alike once, and checks what it receives") {
    test::TempDir dir;
    // 4 ranks save "w" and "v" replica-parallel, each its own "rng"; chunks of 4 KiB
    fault::ThreadGroup four(4, std::chrono::seconds(10));
    fault::run_ranks(four, [&](fault::ThreadComm& comm) {
        ckpt::ParamDict d;
        d.set("w", iota({300, 64}));
        d.set("v", iota({1000}, 7));
        d.set("rng", iota({4}, static_cast<float>(10 * comm.rank())));
        const ckpt::PieceMap declared{{"rng", ckpt::PiecePlace::per_rank()}};
        save_share(comm, dir.path(), 3, fault::replica_share(d, 4, comm.rank(), declared), declared);
    }).rethrow();
    const fs::path index_file = dir.path() / "index-step_3.ckpt";
    const ckpt::GlobalIndex index = ckpt::read_global_index(index_file);
    auto like = [] {
        ckpt::ParamDict d;
        d.set("w", ckpt::Tensor(ckpt::DType::float32, {300, 64}));
        d.set("v", ckpt::Tensor(ckpt::DType::float32, {1000}));
        d.set("rng", ckpt::Tensor(ckpt::DType::float32, {4}));
        return d;
    };
    const ckpt::PieceMap mine{{"rng", ckpt::PiecePlace::per_rank()}};
    const std::uint64_t alike = 300 * 64 * 4 + 1000 * 4;
    SUBCASE("3 ranks: every rank gets every tensor, reading a third of those they load alike") {
        std::vector<std::uint64_t> read(3);
        fault::ThreadGroup three(3, std::chrono::seconds(10));
        fault::run_ranks(three, [&](fault::ThreadComm& comm) {
            const auto got = fault::load_resharded_read_once(comm, index, index_file, like(), mine);
            CHECK(got.state.at("w") == ckpt::Value(iota({300, 64})));
            CHECK(got.state.at("v") == ckpt::Value(iota({1000}, 7)));
            CHECK(got.state.at("rng") == ckpt::Value(iota({4}, static_cast<float>(10 * comm.rank()))));
            CHECK(got.bytes_needed == alike + 16);
            read[static_cast<std::size_t>(comm.rank())] = got.bytes_read;
        }).rethrow();
        const std::uint64_t total = read[0] + read[1] + read[2];
        CAPTURE(total);
        // each byte once, and at each cut through a saved piece a part of a chunk more
        CHECK(total >= alike + 3 * 16);
        CHECK(total <= alike + 3 * 16 + 4 * 4096);
        for (const auto r : read) CHECK(r < alike / 2);
    }
    SUBCASE("a run damaged on its way is refused by the rank that received it") {
        std::vector<std::string> errors(2);
        fault::ThreadGroup two(2, std::chrono::seconds(10));
        fault::run_ranks(two, [&](fault::ThreadComm& comm) {
            CorruptingComm corrupting{comm, 1};
            try {
                fault::load_resharded_read_once(corrupting, index, index_file, like(), mine);
            } catch (const ckpt::ChecksumError& e) {
                errors[static_cast<std::size_t>(comm.rank())] = e.what();
            }
        }).rethrow();
        CHECK(errors[0].empty());
        CHECK(errors[1].find("as received from the rank that read it, does not match its checksum") != std::string::npos);
    }
    SUBCASE("ranks that load different tensors each read all they need") {
        std::vector<std::uint64_t> read(2);
        fault::ThreadGroup two(2, std::chrono::seconds(10));
        fault::run_ranks(two, [&](fault::ThreadComm& comm) {
            ckpt::ParamDict d = like();
            if (comm.rank() == 1) d.erase("v");
            const auto got = fault::load_resharded_read_once(comm, index, index_file, d, mine);
            CHECK(got.state.at("w") == ckpt::Value(iota({300, 64})));
            CHECK(got.state.contains("v") == (comm.rank() == 0));
            read[static_cast<std::size_t>(comm.rank())] = got.bytes_read;
        }).rethrow();
        CHECK(read[1] >= 300 * 64 * 4);
    }
}

TEST_CASE("a load reads each piece of sharded state once in its replica group, and checks what it receives") {
    test::TempDir dir;
    // 4 ranks save "w" replica-parallel and "m" in 2 pieces of 3000 elements, each cut between
    // the 2 ranks keeping it; chunks of 4 KiB
    auto piece_of = [](int rank) {
        const int piece = rank % 2;
        return ckpt::PieceMap{{"m", {"m", {6000}, static_cast<std::uint64_t>(3000 * piece)}}};
    };
    fault::ThreadGroup four(4, std::chrono::seconds(10));
    fault::run_ranks(four, [&](fault::ThreadComm& comm) {
        const ckpt::PieceMap declared = piece_of(comm.rank());
        ckpt::ParamDict d;
        d.set("w", iota({300, 16}));
        d.set("m", iota({3000}, static_cast<float>(declared.at("m").first)));
        save_share(comm, dir.path(), 3, fault::replica_share(d, 4, comm.rank(), declared, {2, comm.rank() / 2}), declared);
    }).rethrow();
    const fs::path index_file = dir.path() / "index-step_3.ckpt";
    const ckpt::GlobalIndex index = ckpt::read_global_index(index_file);
    const ckpt::ParamDict like{{"w", ckpt::Tensor(ckpt::DType::float32, {300, 16})},
                               {"m", ckpt::Tensor(ckpt::DType::float32, {3000})}};
    std::vector<std::uint64_t> read(4);
    fault::run_ranks(four, [&](fault::ThreadComm& comm) {
        const ckpt::PieceMap mine = piece_of(comm.rank());
        const auto got = fault::load_resharded_read_once(comm, index, index_file, like, mine);
        CHECK(got.state.at("w") == ckpt::Value(iota({300, 16})));
        CHECK(got.state.at("m") == ckpt::Value(iota({3000}, static_cast<float>(mine.at("m").first))));
        CHECK(got.bytes_needed == (300 * 16 + 3000) * 4);
        read[static_cast<std::size_t>(comm.rank())] = got.bytes_read;
    }).rethrow();
    const std::uint64_t total = read[0] + read[1] + read[2] + read[3];
    CAPTURE(total);
    // each byte once (the runs are the saved pieces: no chunk is read in part), where each rank
    // reading its whole piece would read 48000 bytes of "m"
    CHECK(total >= (300 * 16 + 6000) * 4);
    CHECK(total <= (300 * 16 + 6000) * 4 + 4096);
    // rank 3 cannot reach the files: rank 1 reads their piece for both, the others "w" for all
    fault::run_ranks(four, [&](fault::ThreadComm& comm) {
        const ckpt::PieceMap mine = piece_of(comm.rank());
        const fs::path where = comm.rank() == 3 ? dir / "gone" / "index-step_3.ckpt" : index_file;
        const auto got = fault::load_resharded_read_once(comm, index, where, like, mine);
        CHECK(got.state.at("w") == ckpt::Value(iota({300, 16})));
        CHECK(got.state.at("m") == ckpt::Value(iota({3000}, static_cast<float>(mine.at("m").first))));
        read[static_cast<std::size_t>(comm.rank())] = got.bytes_read;
    }).rethrow();
    CHECK(read[3] == 0);
    CHECK(read[1] >= 12000);  // all of its group's piece
    // a run damaged on its way: the pieces, received by rank 3 from rank 1 of its group
    std::vector<std::string> errors(4);
    fault::run_ranks(four, [&](fault::ThreadComm& comm) {
        // each rank's slot: its quarter of "w" (4800 bytes), then its half of its piece (6000, padded to 6016)
        CorruptingComm corrupting{comm, 3, 10816 + 4800 + 100};
        try {
            fault::load_resharded_read_once(corrupting, index, index_file, like, piece_of(comm.rank()));
        } catch (const ckpt::ChecksumError& e) {
            errors[static_cast<std::size_t>(comm.rank())] = e.what();
        }
    }).rethrow();
    CHECK(errors[0].empty());
    CHECK(errors[3].find("the pieces of sharded state rank 1 read for its replica group, as received, do not match") !=
          std::string::npos);
}

TEST_CASE("a rank's replica-parallel file says it is a share, and a load of it alone into a whole state says how to load") {
    test::TempDir dir;
    fault::ThreadGroup group(2, std::chrono::seconds(10));
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        ckpt::Tensor w = iota({40, 4});
        nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast> files(dir / ("rank_" + std::to_string(comm.rank())), "net",
                                                                    {}, ckpt::EverySteps{1});
        fault::ReplicaParallel shared(comm, files);
        nn::RunContext ctx = step_context(7, [&] { return ckpt::ParamDict{{"w", w}, {"lr", 0.5}}; });
        shared.on_step_end(ctx);
        fault::commit_global_index(comm, dir.path(), 7, *shared.last_saved(), shared.piece_map());
    }).rethrow();
    const ckpt::Path file = *ckpt::latest(dir / "rank_1", "net");
    const auto contents = ckpt::read_contents(file);
    const auto share = ckpt::detail::share_in(contents.entries);
    REQUIRE(share);
    CHECK(share->starts_with("rank 1 of 2's share of global step 7 of a replica-parallel save"));
    CHECK_FALSE(ckpt::load_checkpoint(file).contains(std::string(ckpt::detail::share_record_entry)));  // not a value
    ckpt::ParamDict whole{{"w", ckpt::Tensor(ckpt::DType::float32, {40, 4})}, {"lr", 0.0}};
    CHECK_THROWS_WITH_AS(ckpt::load_checkpoint_into(file, whole, /*strict=*/true),
                         doctest::Contains("The file is rank 1 of 2's share of global step 7 of a replica-parallel "
                                           "save: it holds parts of the tensors the ranks hold alike, not all of them. "
                                           "Load the step through its global index (index-step_7.ckpt)"),
                         ckpt::LoadMismatch);
    // through the index, the step loads whole, and the record is no value of it
    const auto got = ckpt::load_resharded(dir.path() / "index-step_7.ckpt", whole);
    CHECK(got.state.at("w") == ckpt::Value(iota({40, 4})));
    CHECK(got.state.get<double>("lr") == 0.5);
    CHECK_FALSE(got.state.contains(std::string(ckpt::detail::share_record_entry)));
}

TEST_CASE("replica-parallel saves with no index committed stop at the next hook, saying what is missing") {
    test::TempDir dir;
    std::vector<std::string> refused(2);
    fault::ThreadGroup group(2, std::chrono::seconds(10));
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        ckpt::Tensor w = iota({40, 4});
        nn::ModelCheckpoint<ckpt::EverySteps, ckpt::KeepLast> files(dir / ("rank_" + std::to_string(comm.rank())), "net",
                                                                    {}, ckpt::EverySteps{1});
        fault::ReplicaParallel shared(comm, files);
        nn::RunContext ctx = step_context(1, [&] { return ckpt::ParamDict{{"w", w}}; });
        for (std::int64_t step = 1; step <= 2; ++step) {
            ctx.step = ctx.global_step = step;
            try {
                shared.on_step_end(ctx);  // no GlobalIndexer after it
            } catch (const ckpt::ConfigError& e) {
                refused[static_cast<std::size_t>(comm.rank())] = e.what();
            }
        }
    }).rethrow();
    for (const auto& why : refused) {
        CHECK(why.find("replica-parallel save of global step 1 (") != std::string::npos);
        CHECK(why.find("no global index of it is being committed: list a fault::GlobalIndexer") != std::string::npos);
    }
}

TEST_CASE("an index whose pieces of one tensor disagree on its shape is refused as damaged, before anything is read") {
    test::TempDir dir;
    fault::ThreadGroup group(2, std::chrono::seconds(10));
    fault::run_ranks(group, [&](fault::ThreadComm& comm) {
        const fault::ReplicaShare share = fault::replica_share(ckpt::ParamDict{{"w", iota({30, 4})}}, 2, comm.rank());
        const fs::path file = dir / ("rank_" + std::to_string(comm.rank())) / "step_1.ckpt";
        fs::create_directories(file.parent_path());
        ckpt::save_checkpoint(share.state, file);
        fault::commit_global_index(comm, dir.path(), 1, file, share.places);
    }).rethrow();
    // rank 1's piece made to claim a bigger tensor, which would place its bytes past the end
    const fs::path index_file = dir.path() / "index-step_1.ckpt";
    ckpt::GlobalIndex index = ckpt::read_global_index(index_file);
    REQUIRE(index.pieces.size() == 2);
    index.pieces[1].global_shape = {3000, 4};
    ckpt::SaveOptions save;
    save.step = 1;
    ckpt::save_checkpoint(ckpt::index_to_dict(index), index_file, save);
    const ckpt::ParamDict like{{"w", ckpt::Tensor(ckpt::DType::float32, {30, 4})}};
    CHECK_THROWS_WITH_AS(ckpt::load_resharded(index_file, like), doctest::Contains("its pieces of 'w' disagree"),
                         ckpt::FormatError);
}
