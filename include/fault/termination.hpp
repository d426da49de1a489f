#pragma once
// Termination signals for data-parallel training: the core's flag (ckpt/preemption.hpp),
// agreed on by every rank through LastWordsCheckpoint (watch_signals).
//
//   fault::TerminationSignals signals;            // installs; the destructor restores
//   fault::LastWordsCheckpoint last_words(comm, dir, {.watch_signals = true});
//   try { trainer.train(…); } catch (const fault::Preempted& p) { return fault::preempted_exit_status; }

#include "../ckpt/preemption.hpp"

namespace fault {

using ckpt::preempted_exit_status;
using ckpt::Preempted;
using ckpt::TerminationSignals;

}  // namespace fault
