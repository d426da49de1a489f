// The managers of the usual policy sets, compiled once in the library with
// CKPT_SEPARATE_COMPILATION: declared extern in the files that include manager.hpp
// (CKPT_INSTANCE is `extern`), instantiated in src/ckpt.cpp (CKPT_INSTANCE is empty). Other
// policy sets, user-defined ones included, are compiled where they are used, as in
// header-only mode. No include guard: src/ckpt.cpp includes it a second time.

namespace ckpt {
CKPT_INSTANCE template class detail::ManagerCore<EveryEpochs, KeepLast, MindSporeNaming, BinaryArchive, NoCodec>;
CKPT_INSTANCE template class detail::ManagerCore<EverySteps, KeepLast, MindSporeNaming, BinaryArchive, NoCodec>;
CKPT_INSTANCE template class detail::ManagerCore<EveryEpochs, KeepLast, StepNaming, BinaryArchive, NoCodec>;
CKPT_INSTANCE template class detail::ManagerCore<EverySteps, KeepLast, StepNaming, BinaryArchive, NoCodec>;
CKPT_INSTANCE template class CheckpointManager<EveryEpochs, KeepLast, MindSporeNaming, BinaryArchive, NoCodec>;
CKPT_INSTANCE template class CheckpointManager<EverySteps, KeepLast, MindSporeNaming, BinaryArchive, NoCodec>;
CKPT_INSTANCE template class CheckpointManager<EveryEpochs, KeepLast, StepNaming, BinaryArchive, NoCodec>;
CKPT_INSTANCE template class CheckpointManager<EverySteps, KeepLast, StepNaming, BinaryArchive, NoCodec>;
}  // namespace ckpt
