"""Rule reachability from torch-built calls, for the rules test_ops_cpu.py does not break: verify,
commit and record rules, dims.head_dim, gate.cover_tokens, arg.stride. Each call breaks one rule alone;
the refusal names exactly that rule, agrees with can_implement, and every buffer is
bit-identical afterwards. Also opcheck over the can_* query ops."""

import pytest
import torch

import kdaguard
from kdaguard import ops

from test_ops_cpu import _decode_args, _snapshot, decode_problem, verify_problem
from test_records_cpu import record_args, records_for


def _commit_problem():
    p = verify_problem()
    return dict(scratch=p["scratch"].zero_(), scratch_row_map=p["scratch_row_map"],
                state=p["state"], cache_indices=p["cache_indices"],
                accepted=torch.tensor([1, 3], dtype=torch.int32), draft_token_num=3,
                cu_seqlens=p["cu_seqlens"])


def _break(rule):
    """(entry, kwargs) of a call that breaks `rule` alone."""
    if rule in ("dims.head_dim", "gate.cover_tokens", "arg.stride"):
        p = decode_problem(B=2, padding=False, packed=False, K=64, V=64)
        B, HV = 2, p["v"].shape[1]
        if rule == "dims.head_dim":
            p = decode_problem(B=2, padding=False, packed=False, K=32, V=64)
        elif rule == "gate.cover_tokens":
            p["b"] = p["b"][:1]
        else:  # an output view that maps every value head to one address
            p["out"] = torch.zeros(B, 1, 64, dtype=p["q"].dtype).expand(B, HV, 64)
        return "decode", p
    if rule == "commit.accepted":
        p = _commit_problem()
        p["accepted"] = torch.tensor([4, 0], dtype=torch.int32)
        return "commit", p
    if rule in ("records.steps", "records.rows"):
        p = verify_problem()
        records = records_for(p, steps=2) if rule == "records.steps" else records_for(p)[:1]
        return "record_verify", record_args(p, records)
    if rule == "accept.prior_accepted":
        p = verify_problem()
        return "accept_verify", {**record_args(p, records_for(p)), "prior_records": records_for(p),
                                 "prior_accepted": torch.tensor([4, 0], dtype=torch.int32)}
    p = verify_problem()
    N, T = 2, p["draft_token_num"]
    if rule == "verify.draft_tokens":
        p["draft_token_num"] = 0
    elif rule == "verify.scratch_steps":
        p["scratch"] = p["scratch"][:, :T - 1].contiguous()
    elif rule == "verify.scratch_layout":
        p["scratch"] = p["scratch"].to(torch.bfloat16)
    elif rule == "verify.scratch_rows":
        p["scratch"] = p["scratch"][:1].contiguous()
        p["scratch_indices"] = torch.arange(T, dtype=torch.int32).repeat(N, 1) % T
        p.pop("scratch_row_map")
    elif rule == "verify.row_length":
        p["cu_seqlens"] = torch.tensor([0, 4, 6], dtype=torch.int32)
    elif rule == "verify.row_map_identity":
        p["scratch_row_map"] = torch.tensor([1, 0], dtype=torch.int32)
    elif rule == "verify.scratch_indices":
        p["scratch_indices"] = torch.arange(N * T).view(N, T)  # int64
    elif rule == "seqlens.total":
        p["cu_seqlens"] = torch.tensor([0, 3, 5], dtype=torch.int32)
    elif rule == "seqlens.start":
        p["cu_seqlens"] = torch.tensor([1, 3, 6], dtype=torch.int32)
    elif rule == "index.unique":
        p["cache_indices"] = torch.tensor([2, 2], dtype=torch.int32)
    return "verify", p


RULES = ["dims.head_dim", "gate.cover_tokens", "arg.stride", "commit.accepted",
         "verify.draft_tokens", "verify.scratch_steps", "verify.scratch_layout",
         "verify.scratch_rows", "verify.row_length", "verify.row_map_identity",
         "verify.scratch_indices", "seqlens.total", "seqlens.start", "index.unique",
         "records.steps", "records.rows", "accept.prior_accepted"]


@pytest.mark.parametrize("rule", RULES)
def test_refusal_names_the_rule_alone_and_touches_nothing(rule):
    entry, p = _break(rule)
    before = _snapshot(p)
    with pytest.raises(kdaguard.ContractViolation) as info:
        getattr(ops, entry)(**p)
    assert info.value.entry == entry and info.value.rules == (rule,), info.value
    assert _snapshot(p) == before
    verdict = ops.can_implement(entry, **p)
    assert not verdict.ok and verdict.rules == (rule,), verdict.text


def test_rules_not_reachable_from_torch_are_the_ones_listed():
    """arg.extent (torch refuses views past their storage), arg.device (needs two devices: the
    GPU tests' side) and prefill.indexed_pool (the op's schema requires both tensors) are the
    only catalogue rules no CPU test here breaks; a new rule must join a test or this list."""
    import test_ops_cpu

    covered = set(RULES) | set(test_ops_cpu.DECODE_RULES) | {
        "seqlens.monotone", "index.padding"}  # test_prefill_value_rules
    unreachable = {"arg.extent", "arg.device", "prefill.indexed_pool"}
    assert {r.id for r in kdaguard.rules()} - covered == unreachable


def test_opcheck_query_ops():
    """The can_* ops return the refusal text (a str): opcheck's schema and autograd-registration
    checks apply; its fake-tensor and AOT checks compare tensor outputs and do not."""
    utils = ("test_schema", "test_autograd_registration")
    p = decode_problem(B=2, padding=True, packed=False)
    args, kw = _decode_args(p)
    torch.library.opcheck(torch.ops.kdaguard.can_decode.default, args[:13], kw, test_utils=utils)
    r = verify_problem()
    out = torch.empty(r["v"].shape, dtype=r["v"].dtype)
    vargs = (r["q"], r["k"], r["v"], None, r["g"], None, None, r["b"], None, r["cu_seqlens"],
             r["state"], r["cache_indices"], r["scratch"], r["scratch_row_map"], None, out,
             r["draft_token_num"])
    torch.library.opcheck(torch.ops.kdaguard.can_verify.default, vargs, test_utils=utils)
    assert torch.ops.kdaguard.can_verify.default(*vargs) == ""
    c = _commit_problem()
    cargs = (c["scratch"], c["scratch_row_map"], None, c["state"], c["cache_indices"],
             c["accepted"], c["cu_seqlens"], 3)
    torch.library.opcheck(torch.ops.kdaguard.can_commit.default, cargs, test_utils=utils)
    assert torch.ops.kdaguard.can_commit.default(*cargs) == ""
    import test_ops_cpu
    q = test_ops_cpu.prefill_problem()
    pargs = (q["q"], q["k"], q["v"], q["a"], None, q["A_log"], q["dt_bias"], None, q["beta"],
             q["cu_seqlens"], q["initial_state"], q["initial_state_indices"],
             torch.empty(q["v"].shape, dtype=q["v"].dtype))
    torch.library.opcheck(torch.ops.kdaguard.can_prefill.default, pargs, test_utils=utils)
    assert torch.ops.kdaguard.can_prefill.default(*pargs) == ""
    bad = list(pargs)
    bad[11] = q["initial_state_indices"].long()
    assert "[arg.dtype]" in torch.ops.kdaguard.can_prefill.default(*bad).splitlines()[0]


def test_opcheck_record_query_ops():
    utils = ("test_schema", "test_autograd_registration")
    r = verify_problem()
    records = records_for(r).zero_()
    out = torch.empty(r["v"].shape, dtype=r["v"].dtype)
    tokens = (r["q"], r["k"], r["v"], None, r["g"], None, None, r["b"], None)
    rargs = (*tokens, r["cu_seqlens"], r["state"], r["cache_indices"], records, out, 3)
    torch.library.opcheck(torch.ops.kdaguard.can_record_verify.default, rargs, test_utils=utils)
    assert torch.ops.kdaguard.can_record_verify.default(*rargs) == ""
    accepted = torch.tensor([1, 3], dtype=torch.int32)
    cargs = (records, r["state"], r["cache_indices"], accepted, None, 3)
    torch.library.opcheck(torch.ops.kdaguard.can_replay_commit.default, cargs, test_utils=utils)
    assert torch.ops.kdaguard.can_replay_commit.default(*cargs) == ""
    aargs = (*tokens, r["cu_seqlens"], r["state"], r["cache_indices"], records, accepted,
             records_for(r).zero_(), out, 3)
    torch.library.opcheck(torch.ops.kdaguard.can_accept_verify.default, aargs, test_utils=utils)
    assert torch.ops.kdaguard.can_accept_verify.default(*aargs) == ""
    bad = list(cargs)
    bad[3] = torch.tensor([4, 0], dtype=torch.int32)
    assert "[commit.accepted]" in torch.ops.kdaguard.can_replay_commit.default(*bad).splitlines()[0]
