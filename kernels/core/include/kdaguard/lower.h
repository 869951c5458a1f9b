// Lowering: a validated call becomes the plain params struct its kernels read. Only call these
// on a call that validate() accepted; they re-derive nothing the contracts proved.
#pragma once

#include "kdaguard/contracts/call.h"
#include "kdaguard/params.h"

namespace kdaguard {

DecodeParams lower(const DecodeCall& call);
PrefillParams lower(const PrefillCall& call);
VerifyParams lower(const VerifyCall& call);
CommitParams lower(const CommitCall& call);
RecordVerifyParams lower(const RecordVerifyCall& call);
ReplayCommitParams lower(const ReplayCommitCall& call);
AcceptVerifyParams lower(const AcceptVerifyCall& call);

}  // namespace kdaguard
