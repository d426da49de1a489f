// A 2-D heat solver under MPI that survives losing a rank: the N x M field is cut into
// column blocks, one per rank, each an Eigen matrix (column-major, so a block's columns and
// the halo columns exchanged with its neighbours are contiguous). Every --every iterations
// each rank saves its block to the fast local level and the ranks commit the step's global
// index; every --copy-every-th checkpoint is copied in the background to the durable shared
// level, and its index follows once every rank's file is there. With --async the saves are
// written in the background and each index is committed once every rank's file is durable
// (fault::IndexCommitter): the iterations wait for neither.
//
// With Debian's Open MPI a rank's death ends the whole job. Run the same command again and
// it resumes from the newest step whose index and files are whole, on the local level or
// else on the durable one, and ends with the same field, bit for bit, as a run that never
// stopped. Run it again with another number of ranks and each rank loads its new columns
// from the 4-rank checkpoint's pieces (resharding): the update of a point reads only its
// neighbours, so the field is still the same to the bit.
//
//   bash scripts/mpirun.sh -np 4 heat_mpi [--local DIR] [--shared DIR] [--rows N] [--cols M]
//        [--iters N] [--every N] [--copy-every K] [--async] [--pace-ms MS] [--timeout-ms MS] [--fresh]

#include <ckpt/ckpt.hpp>
#include <ckpt/types/eigen.hpp>
#include <fault/elastic.hpp>
#include <fault/global_index.hpp>
#include <fault/mpi_comm.hpp>

#include <Eigen/Core>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "../common/cli.hpp"
#include "../common/fresh.hpp"

namespace {

namespace fs = boost::filesystem;

struct Options {
    std::string local = "heat_mpi/local", shared = "heat_mpi/shared";
    Eigen::Index rows = 192, cols = 192;
    std::int64_t iters = 2000, every = 100, copy_every = 2, pace_ms = 0, timeout_ms = 60000;
    bool fresh = false, async = false;
};

constexpr const char* usage_text =
    "heat_mpi [--local DIR] [--shared DIR] [--rows N] [--cols M] [--iters N] [--every N]\n"
    "                [--copy-every K] [--async] [--pace-ms MS] [--timeout-ms MS] [--fresh] [--help]";
constexpr const char* options_text =
    "Solves the 2-D heat equation on an N x M grid cut into column blocks, one per MPI rank, and ends\n"
    "with final_field_xxh3=<hash of the whole field>. Each rank saves its block every --every\n"
    "iterations to DIR/rank_{r} on the local level, with a global index of the step in the local\n"
    "DIR; every K-th checkpoint is copied in the background to the shared level. Run again after a\n"
    "rank died (which ends an Open MPI job), the same command resumes from the newest whole step on\n"
    "either level, with this or another number of ranks, and ends with the same hash. It says how\n"
    "long the iterations took, checkpoints included.\n"
    "\n"
    "  --local DIR       the fast local level (default heat_mpi/local)\n"
    "  --shared DIR      the durable shared level (default heat_mpi/shared)\n"
    "  --rows N, --cols M  grid size (default 192 x 192)\n"
    "  --iters N         iterations to run (default 2000)\n"
    "  --every N         a checkpoint every N iterations (default 100)\n"
    "  --copy-every K    copy every K-th checkpoint to the shared level (default 2)\n"
    "  --async           write the checkpoints in the background and commit each index once every\n"
    "                    rank's file is durable: the iterations wait for neither\n"
    "  --pace-ms MS      sleep MS milliseconds per iteration, to have time to kill a rank (default 0)\n"
    "  --timeout-ms MS   every MPI call's timeout (default 60000)\n"
    "  --fresh           move both levels aside first and start from iteration 0\n"
    "\n"
    "Run it with mpirun: bash scripts/mpirun.sh -np 4 heat_mpi (as root, or with more ranks than\n"
    "cores, mpirun needs the flags that script passes).\n";

Options parse(int argc, char** argv) {
    Options o;
    examples::Cli cli(argc, argv, usage_text, options_text);
    while (const auto a = cli.next()) {
        if (*a == "--local") o.local = cli.value();
        else if (*a == "--shared") o.shared = cli.value();
        else if (*a == "--rows") o.rows = cli.count();
        else if (*a == "--cols") o.cols = cli.count();
        else if (*a == "--iters") o.iters = cli.count();
        else if (*a == "--every") o.every = cli.count();
        else if (*a == "--copy-every") o.copy_every = cli.count();
        else if (*a == "--pace-ms") o.pace_ms = cli.count();
        else if (*a == "--timeout-ms") o.timeout_ms = cli.count();
        else if (*a == "--fresh") o.fresh = true;
        else if (*a == "--async") o.async = true;
        else cli.unknown();
    }
    if (o.rows < 3 || o.cols < 3) cli.fail("--rows and --cols must be at least 3");
    if (o.iters < 1 || o.every < 1 || o.copy_every < 1 || o.timeout_ms < 1)
        cli.fail("--iters, --every, --copy-every and --timeout-ms must be at least 1");
    return o;
}

/// The bytes of `n` doubles as 2n floats: the communicator moves floats, and moves them
/// without arithmetic, so doubles travel exactly.
std::span<float> as_floats(double* p, Eigen::Index n) { return {reinterpret_cast<float*>(p), static_cast<std::size_t>(2 * n)}; }

/// This rank's columns [c0, c0 + w) of the rows x cols field, with a halo column on each side
/// (column 0 and w + 1 of `u`): the neighbours' edge columns, exchanged every iteration.
class Block {
public:
    Block(const Options& o, int rank, int size)
        : rows_(o.rows), cols_(o.cols), c0_(o.cols * rank / size), w_(o.cols * (rank + 1) / size - c0_),
          rank_(rank), size_(size), u_(rows_, w_ + 2), next_(rows_, w_ + 2) {
        if (w_ < 1)
            throw ckpt::ConfigError("--cols " + std::to_string(cols_) + " leaves rank " + std::to_string(rank) +
                                    " no column: run fewer ranks");
        u_.setZero();
        for (Eigen::Index j = 1; j <= w_; ++j) {
            const Eigen::Index c = c0_ + j - 1;
            u_(0, j) = 100.0;  // a hot top edge
            if (c == 0) u_.col(j).setLinSpaced(100.0, 0.0);  // a graded left edge
        }
        next_ = u_;
    }

    /// One explicit step of the heat equation: the halos, then every point inside the domain.
    template <class Comm>
    void step(Comm& comm) {
        exchange_halos(comm);
        constexpr double alpha = 0.2;
        const Eigen::Index n = rows_ - 2;
        for (Eigen::Index j = 1; j <= w_; ++j) {
            const Eigen::Index c = c0_ + j - 1;
            if (c == 0 || c == cols_ - 1) continue;  // the fixed left and right edges
            next_.col(j).segment(1, n) =
                u_.col(j).segment(1, n) +
                alpha * (u_.col(j).segment(0, n) + u_.col(j).segment(2, n) + u_.col(j - 1).segment(1, n) +
                         u_.col(j + 1).segment(1, n) - 4.0 * u_.col(j).segment(1, n));
        }
        u_.swap(next_);  // the fixed edges are never written: both buffers hold them
    }

    /// The columns this rank owns, without the halos: what it saves and loads.
    Eigen::Map<Eigen::MatrixXd> owned() { return {u_.data() + rows_, rows_, w_}; }
    /// Where they sit in the whole field, as stored: a column-major rows x cols matrix is kept as
    /// its transpose [cols, rows], so column block [c0, c0 + w) is elements [c0 * rows, …) of it.
    ckpt::PiecePlace place() const {
        return {"u", ckpt::Shape{cols_, rows_}, static_cast<std::uint64_t>(c0_ * rows_)};
    }
    Eigen::Index first_column() const { return c0_; }
    Eigen::Index width() const { return w_; }

private:
    // Sends are rendezvous (they return once the receiver has the data), so neighbours take
    // turns: even ranks send first, odd ranks receive first.
    template <class Comm>
    void exchange_halos(Comm& comm) {
        const bool even = rank_ % 2 == 0, left = rank_ > 0, right = rank_ + 1 < size_;
        auto send_right = [&] { if (right) comm.send(as_floats(u_.col(w_).data(), rows_), rank_ + 1, 1); };
        auto recv_left = [&] { if (left) comm.recv(as_floats(u_.col(0).data(), rows_), rank_ - 1, 1); };
        auto send_left = [&] { if (left) comm.send(as_floats(u_.col(1).data(), rows_), rank_ - 1, 2); };
        auto recv_right = [&] { if (right) comm.recv(as_floats(u_.col(w_ + 1).data(), rows_), rank_ + 1, 2); };
        if (even) { send_right(); recv_left(); send_left(); recv_right(); }
        else { recv_left(); send_right(); recv_right(); send_left(); }
    }

    Eigen::Index rows_, cols_, c0_, w_;
    int rank_, size_;
    Eigen::MatrixXd u_, next_;
};

std::string hex(std::uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

/// The whole field on rank 0 (the others send it their blocks): its hash, and its centre.
template <class Comm>
std::pair<std::string, double> gather_field(Comm& comm, Block& block, const Options& o) {
    auto owned = block.owned();
    if (comm.rank() != 0) {
        comm.send(as_floats(owned.data(), owned.size()), 0, 3);
        return {};
    }
    Eigen::MatrixXd field(o.rows, o.cols);
    field.middleCols(0, block.width()) = owned;
    for (int r = 1; r < comm.size(); ++r) {
        const Eigen::Index c0 = o.cols * r / comm.size(), w = o.cols * (r + 1) / comm.size() - c0;
        comm.recv(as_floats(field.data() + c0 * o.rows, o.rows * w), r, 3);  // its columns, contiguous
    }
    return {hex(ckpt::detail::xxh3(field.data(), static_cast<std::size_t>(field.size()) * sizeof(double))),
            field(o.rows / 2, o.cols / 2)};
}

int run(const Options& o, fault::MpiComm& comm) {
    const int rank = comm.rank(), size = comm.size();
    auto say = [rank](const std::string& line) {
        if (rank != 0) return;
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
    };
    const fs::path local(o.local), shared(o.shared);
    const std::string me = "rank_" + std::to_string(rank);
    if (o.fresh) {
        if (rank == 0)
            for (const auto& dir : {local, shared})
                if (const auto aside = examples::move_aside(dir)) say("--fresh: moved " + dir.string() + " aside to " + aside->string());
        comm.barrier();
    }

    Block block(o, rank, size);
    std::int64_t iteration = 0;
    auto state = [&] {
        ckpt::ParamDict d;
        d.set("u", ckpt::view_of(block.owned()));
        d.set("iteration", ckpt::view_of(iteration));
        return d;
    };
    const ckpt::PieceMap places{{"u", block.place()}};

    ckpt::ManagerOptions options;
    options.write_meta = false;
    options.async_save = o.async;
    options.durable = ckpt::DurableLevel{.directory = shared / me, .retention = ckpt::KeepLast{3}, .every = o.copy_every};
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepLast, ckpt::StepNaming> manager(
        local / me, "heat", ckpt::EverySteps{o.every}, ckpt::KeepLast{2}, {}, options);

    // the newest step whose global index and files are whole, on the local level or else the
    // durable one; with another number of ranks each loads its new columns from the pieces
    if (auto resumed = fault::load_latest_resharded(comm, {ckpt::Path(local), ckpt::Path(shared)}, state(), places)) {
        ckpt::ParamDict views = state();
        ckpt::load_param_into_net(views, resumed->state.state, /*strict=*/true);
        say("resuming from " + resumed->index.string() + " (saved by " + std::to_string(resumed->saved_by) +
            " ranks, now " + std::to_string(size) + "): iteration " + std::to_string(iteration) + " done");
    } else {
        say("no whole checkpoint in " + local.string() + " or " + shared.string() + ": starting from iteration 0");
    }

    // commits each step's global index: at once with synchronous saves, with --async once every
    // rank's file is durable (asked at the next iterations)
    fault::IndexCommitter commits(comm, manager, local);
    std::int64_t saves = 0, indexes = 0;
    auto committed = [&](const std::optional<fs::path>& index) {
        if (!index) return;
        ++indexes;
        if (o.async) say(index->filename().string() + " committed");
    };
    using clock = std::chrono::steady_clock;
    const auto began = clock::now();
    double checkpoint_seconds = 0;  // in the calls below: what checkpoints cost the iterations
    for (std::int64_t it = iteration + 1; it <= o.iters; ++it) {
        block.step(comm);
        iteration = it;
        const auto call = clock::now();
        auto file = manager.on_step(ckpt::Progress::at_iteration(it), state);
        const auto index = file ? commits.saved(it, *file, places) : commits.poll();
        checkpoint_seconds += std::chrono::duration<double>(clock::now() - call).count();
        if (file) {
            ++saves;
            say("iteration " + std::to_string(it) + (o.async ? ": saved" : ": saved and indexed"));
        }
        committed(index);
        if (o.pace_ms) std::this_thread::sleep_for(std::chrono::milliseconds(o.pace_ms));
    }
    const double loop_seconds = std::chrono::duration<double>(clock::now() - began).count();
    if (auto file = manager.on_train_end(ckpt::Progress::at_iteration(iteration), state))
        committed(commits.saved(iteration, *file, places));
    committed(commits.finish());
    manager.wait_flushed();  // the newest checkpoint on the durable level before the job ends
    const auto flushed = manager.flush_stats();
    const auto [hash, centre] = gather_field(comm, block, o);
    say("copied to the shared level by rank 0: " + std::to_string(flushed.flushed) + " file(s)");
    if (rank == 0)
        std::printf("iterations took %.6f s, %.6f s of it in checkpoint calls; %" PRId64
                    " checkpoint(s) saved in them, %" PRId64 " index(es) committed\n",
                    loop_seconds, checkpoint_seconds, saves, indexes);
    if (rank == 0) std::printf("centre temperature %.6f after %lld iterations\nfinal_field_xxh3=%s\n", centre,
                               static_cast<long long>(iteration), hash.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    try {
        fault::MpiSession mpi(argc, argv);
        fault::MpiComm comm(mpi, {.timeout = std::chrono::milliseconds(o.timeout_ms)});
        return run(o, comm);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "heat_mpi: %s\n", e.what());
        return 1;
    }
}
