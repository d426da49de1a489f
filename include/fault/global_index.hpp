#pragma once
// The global index of a saved step (ckpt/reshard.hpp), committed by every rank together:
// each rank saves its own file, durably, then calls
//
//   fault::commit_global_index(comm, dir, global_step, my_file, dp.piece_map());
//
// Each rank describes its file (its pieces' places, file offsets and chunk checksums) and
// sends the description to the lowest rank, which writes {dir}/index-step_{g}.ckpt
// atomically and durably; the ranks then meet at a barrier, so that on return every rank
// knows the index is in place. A rank lost before the index is written leaves no index of
// that step (its files alone), never a partial one.

#include <boost/filesystem.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "../ckpt/checkpoint.hpp"
#include "../ckpt/reshard.hpp"
#include "communicator.hpp"
#include "memory_level.hpp"

namespace fault {

/// Where the global index of `global_step` lives in `dir`.
inline boost::filesystem::path global_index_path(const ckpt::PathArg& dir, std::int64_t global_step) {
    return dir / ("index-step_" + std::to_string(global_step) + ".ckpt");
}

/// See the file comment. `my_file` must lie under `dir` (the index names it relative to
/// `dir`); returns the index's path. A collective.
template <Communicator Comm>
boost::filesystem::path commit_global_index(Comm& comm, const ckpt::PathArg& dir, std::int64_t global_step,
                                            const ckpt::PathArg& my_file, const ckpt::PieceMap& places = {},
                                            std::uint64_t chunk_bytes = 1u << 20) {
    constexpr int tag = 0x494458;  // "IDX"
    const auto relative = boost::filesystem::relative(my_file, dir);
    if (relative.empty() || *relative.begin() == "..")
        throw ckpt::ConfigError("global index: '" + my_file.string() + "' is not under '" + dir.string() + "'");
    const ckpt::GlobalIndex mine =
        ckpt::describe_checkpoint(my_file, relative.generic_string(), comm.rank(), places, chunk_bytes);
    const auto path = global_index_path(dir, global_step);
    if (comm.rank() != 0) {
        PackedState packed;
        packed.pack(ckpt::index_to_dict(mine), global_step);
        detail::send_packed(comm, packed, 0, tag);
    } else {
        ckpt::GlobalIndex index = mine;
        index.global_step = global_step;
        index.world_size = comm.size();
        for (int r = 1; r < comm.size(); ++r) {
            PackedState packed;
            detail::receive_packed(comm, packed, r, tag);
            const std::string what = "global index: rank " + std::to_string(r) + "'s description of step " +
                                     std::to_string(global_step);
            const ckpt::GlobalIndex theirs = ckpt::index_from_dict(packed.unpack(what), what);
            if (theirs.chunk_bytes != index.chunk_bytes)
                throw ckpt::ConfigError(what + " uses chunks of " + std::to_string(theirs.chunk_bytes) + " bytes, rank 0 " +
                                        std::to_string(index.chunk_bytes));
            index.pieces.insert(index.pieces.end(), theirs.pieces.begin(), theirs.pieces.end());
        }
        ckpt::SaveOptions opts;
        opts.step = global_step;
        ckpt::save_checkpoint(ckpt::index_to_dict(index), path, opts);
    }
    comm.barrier();
    return path;
}

}  // namespace fault
