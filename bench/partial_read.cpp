// partial_read: one entry of a checkpoint, read and verified alone (ckpt::open, format
// version 3), against a full verified load of the same file.
//
// The state is 100 float32 tensors of 1 % of --mib MiB each (default 256 MiB, 2.56 MiB a
// tensor), saved once. Then, round by round, alternating in the same process, warm page cache:
//
//   full     ckpt::load_checkpoint(path): every byte read and checked against the body checksum
//   entry    ckpt::open(path).read(name): the header and table of contents read and checked,
//            then the entry's chunks read and checked (a different entry each round)
//   rows     ckpt::open(path).read_rows(name, 0, 16): 16 rows of one tensor, one chunk
//   v1 entry ckpt::open of the same state saved as format version 1 (chunk_bytes 0): what the
//            entry costs without chunk checksums (the whole file verified)
//
// and what the chunk checksums cost a save, alternating in the same way (each save to a new
// file, fsynced, as every save is):
//
//   save v3  save_checkpoint (chunk checksums hashed before the body is written)
//   save v1  save_checkpoint with chunk_bytes 0
//
// Ratios are time ratios against `full`: entry / full is the figure (target <= 0.05).
//
//   partial_read [--mib N] [--rounds N] [--dir DIR]
//
// Exit status 1 when an entry read differs from what was saved, or the run did not time what
// it planned (every round's reads, each returning its whole tensor, no faster than memory).

#include <ckpt/ckpt.hpp>

#include "bench_support.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace bench;

constexpr int tensors = 100;

int run(const std::string& dir, std::size_t mib, int rounds) {
    print_machine(dir);
    const std::size_t cols = 1024;
    const std::size_t rows = std::max<std::size_t>(16, (mib << 20) / tensors / 4 / cols);
    const std::size_t tensor_bytes = rows * cols * 4;
    std::vector<std::vector<float>> data(tensors, std::vector<float>(rows * cols));
    ckpt::ParamDict state;
    for (int i = 0; i < tensors; ++i) {
        fill_random_floats(data[static_cast<std::size_t>(i)].data(), rows * cols, static_cast<std::uint64_t>(i) + 1);
        state.set("layer." + std::to_string(i),
                  ckpt::Tensor::view(std::span<float>(data[static_cast<std::size_t>(i)]),
                                     {static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols)}));
    }
    const std::string v3 = dir + "/partial_v3.ckpt", v1 = dir + "/partial_v1.ckpt";
    ckpt::save_checkpoint(state, v3);
    ckpt::save_checkpoint(state, v1, {.chunk_bytes = 0});
    std::printf("state: %d float32 tensors of [%zu, %zu] (%.2f MiB each, %.0f MiB in all); chunk %llu KiB\n", tensors, rows,
                cols, tensor_bytes / 1048576.0, tensors * tensor_bytes / 1048576.0,
                static_cast<unsigned long long>(ckpt::default_chunk_bytes >> 10));

    Checks checks;
    std::vector<double> full, entry, few_rows, v1_entry;
    bool same = true;
    for (int round = 0; round < rounds; ++round) {
        const int pick = (round * 37 + 11) % tensors;
        const std::string name = "layer." + std::to_string(pick);
        const auto& want = data[static_cast<std::size_t>(pick)];
        // the order rotates every round, so that none always follows the same one
        for (int k = 0; k < 4; ++k) switch ((k + round) % 4) {
                case 0:
                    full.push_back(timed([&] {
                        const auto d = ckpt::load_checkpoint(v3);
                        same = same && std::memcmp(d.tensor(name).data(), want.data(), tensor_bytes) == 0;
                    }));
                    break;
                case 1:
                    entry.push_back(timed([&] {
                        const auto r = ckpt::open(v3);
                        const auto v = r.read(name);
                        same = same && std::memcmp(v.get_if<ckpt::Tensor>()->data(), want.data(), tensor_bytes) == 0;
                    }));
                    break;
                case 2:
                    few_rows.push_back(timed([&] {
                        const auto r = ckpt::open(v3);
                        const auto t = r.read_rows(name, 0, 16);
                        same = same && std::memcmp(t.data(), want.data(), 16 * cols * 4) == 0;
                    }));
                    break;
                case 3:
                    v1_entry.push_back(timed([&] {
                        const auto r = ckpt::open(v1);
                        const auto v = r.read(name);
                        same = same && std::memcmp(v.get_if<ckpt::Tensor>()->data(), want.data(), tensor_bytes) == 0;
                    }));
                    break;
            }
    }
    std::vector<double> save_v3, save_v1;
    for (int round = 0; round < rounds; ++round)
        for (int k = 0; k < 2; ++k) {
            const bool chunked = (k + round) % 2 == 0;
            const std::string file = dir + (chunked ? "/partial_save_v3.ckpt" : "/partial_save_v1.ckpt");
            remove_file(file);
            (chunked ? save_v3 : save_v1).push_back(timed([&] {
                ckpt::save_checkpoint(state, file, {.chunk_bytes = chunked ? ckpt::default_chunk_bytes : 0});
            }));
            checks.that(ckpt::read_header(file).version == (chunked ? 3u : 1u), "a save wrote another format version");
        }
    checks.count("version 3 saves timed", rounds, static_cast<long long>(save_v3.size()));
    checks.count("version 1 saves timed", rounds, static_cast<long long>(save_v1.size()));
    checks.count("full loads timed", rounds, static_cast<long long>(full.size()));
    checks.count("entry reads timed", rounds, static_cast<long long>(entry.size()));
    checks.count("row reads timed", rounds, static_cast<long long>(few_rows.size()));
    checks.count("version 1 entry reads timed", rounds, static_cast<long long>(v1_entry.size()));
    checks.that(same, "a read gave back other bytes than were saved");
    const double f = median(full), e = median(entry), r = median(few_rows), v = median(v1_entry);
    checks.rate("full load", static_cast<double>(tensors * tensor_bytes), f / 1e3);
    checks.rate("entry read", static_cast<double>(tensor_bytes), e / 1e3);
    checks.positive("row read", r);
    checks.positive("version 1 entry read", v);
    std::printf("medians of %d rounds (ms):\n", rounds);
    std::printf("  full     load_checkpoint                %9.3f\n", f);
    std::printf("  entry    open + read (1 %% of the state) %9.3f   entry / full  %.4f (target <= 0.05)\n", e, e / f);
    std::printf("  rows     open + read_rows (16 rows)      %9.3f   rows / full   %.4f\n", r, r / f);
    std::printf("  v1 entry open + read, version 1 file     %9.3f   v1 / full     %.4f\n", v, v / f);
    const double s3 = median(save_v3), s1 = median(save_v1);
    checks.rate("version 3 save", static_cast<double>(tensors * tensor_bytes), s3 / 1e3);
    checks.rate("version 1 save", static_cast<double>(tensors * tensor_bytes), s1 / 1e3);
    std::printf("  save v3  save_checkpoint                  %9.3f   v3 / v1       %.3f\n", s3, s3 / s1);
    std::printf("  save v1  save_checkpoint, chunk_bytes 0   %9.3f\n", s1);
    std::printf("result: entry/full=%.4f rows/full=%.4f v1_entry/full=%.4f save_v3/v1=%.3f full_ms=%.3f entry_ms=%.3f\n",
                e / f, r / f, v / f, s3 / s1, f, e);
    return checks.status();
}

}  // namespace

int main(int argc, char** argv) {
    const SizeOptions o = size_options(argc, argv, {256, 9, ""});
    return run_in_directory(o.dir, {"partial_v3.ckpt", "partial_v1.ckpt", "partial_save_v3.ckpt", "partial_save_v1.ckpt"},
                            [&](const std::string& d) { return run(d, o.mib, o.rounds); });
}
