"""The record-based speculative path through the PyTorch ops on the CPU (the f64 reference):
record_verify gives verify's outputs and records that replay to commit's states, accept_verify is
replay_commit followed by record_verify, refusals name their rule and touch nothing, opcheck."""

import pytest
import torch

import kdaguard
from kdaguard import ops

import kda_oracle as oracle
from test_ops_cpu import storage_bytes, verify_problem


def records_for(p, *, steps=None):
    """A NaN-poisoned record buffer [N, T_alloc, HV, 2K+V] (f32) for a verify problem."""
    N = p["cache_indices"].shape[0]
    HV, V = p["v"].shape[1], p["v"].shape[2]
    K = p["q"].shape[2]
    T = steps or p["draft_token_num"]
    return torch.full((N, T, HV, 2 * K + V), float("nan"))


def record_args(p, records):
    """record_verify's keyword arguments for a verify problem."""
    keep = ("q", "k", "v", "g", "b", "cu_seqlens", "state", "cache_indices", "draft_token_num",
            "use_qk_l2norm")
    return {**{n: p[n] for n in keep}, "records": records}


def test_record_verify_gives_verifys_outputs_and_records_that_replay_to_commits_states():
    p = verify_problem(T=3)
    committed = p["state"].clone()
    out_verify = ops.verify(**p)
    records = records_for(p)
    out = ops.record_verify(**record_args({**p, "state": committed}, records))
    assert torch.equal(out, out_verify)
    assert torch.equal(committed, p["state"]), "record_verify never writes the pool"
    K = p["q"].shape[2]
    N, T = 2, p["draft_token_num"]
    g = p["g"].view(N, T, *p["g"].shape[1:])
    assert torch.equal(records[..., :K], g), "a record keeps the activated gate"
    k = p["k"].view(N, T, *p["k"].shape[1:]).double()
    k_normed = k / (k.square().sum(-1, keepdim=True) + 1e-6).sqrt()
    HV = p["v"].shape[1]
    k_normed = k_normed.expand(N, T, HV, K)  # H = 1: every value head reads the key head
    assert oracle.rms_ratio(records[..., K:2 * K].double(), k_normed) <= 1e-6
    assert not torch.isnan(records).any(), "every step of every row is recorded"

    accepted = torch.tensor([2, 0], dtype=torch.int32)
    replayed, copied = committed.clone(), committed.clone()
    pool_before = storage_bytes(replayed)
    ops.replay_commit(records=records, state=replayed, cache_indices=p["cache_indices"],
                      accepted=accepted, draft_token_num=T)
    ops.commit(scratch=p["scratch"], scratch_row_map=p["scratch_row_map"], state=copied,
               cache_indices=p["cache_indices"], accepted=accepted, draft_token_num=T)
    assert oracle.rms_ratio(replayed[3].double(), copied[3].double()) <= 1e-6
    slot = replayed[0].numel() * replayed.element_size()
    for s in range(replayed.shape[0]):
        if s != 3:  # a row that accepted nothing, and the slots no row names, are left alone
            assert storage_bytes(replayed)[s * slot:(s + 1) * slot] == \
                pool_before[s * slot:(s + 1) * slot]


def test_accept_verify_is_replay_commit_then_record_verify():
    p = verify_problem(T=3, seed=5)
    draft = verify_problem(T=3, seed=6)  # the next step's tokens, on the same pool
    prior = records_for(p)
    ops.record_verify(**record_args({**p, "state": p["state"].clone()}, prior))
    prior_accepted = torch.tensor([3, 1], dtype=torch.int32)

    fused_pool = p["state"].clone()
    fused_records = records_for(p)
    fused_out = ops.accept_verify(**record_args({**draft, "state": fused_pool}, fused_records),
                                  prior_records=prior, prior_accepted=prior_accepted)

    two_pool = p["state"].clone()
    ops.replay_commit(records=prior, state=two_pool, cache_indices=p["cache_indices"],
                      accepted=prior_accepted, draft_token_num=3)
    two_records = records_for(p)
    two_out = ops.record_verify(**record_args({**draft, "state": two_pool}, two_records))
    assert torch.equal(fused_out, two_out)
    assert torch.equal(fused_pool, two_pool)
    assert torch.equal(fused_records, two_records)


@pytest.mark.parametrize("entry", ["record_verify", "replay_commit", "accept_verify"])
def test_refusals_name_their_rule_and_touch_nothing(entry):
    p = verify_problem(T=3)
    short = records_for(p, steps=2)  # T = 3 draft tokens, 2 steps of records: records.steps
    word = torch.zeros(1, dtype=torch.int64)
    if entry == "record_verify":
        kw = record_args(p, short)
        call = ops.record_verify
    elif entry == "replay_commit":
        kw = dict(records=short, state=p["state"], cache_indices=p["cache_indices"],
                  accepted=torch.tensor([1, 1], dtype=torch.int32), draft_token_num=3)
        call = ops.replay_commit
    else:
        kw = {**record_args(p, records_for(p)), "prior_records": short,
              "prior_accepted": torch.tensor([1, 1], dtype=torch.int32)}
        call = ops.accept_verify
        kw["records"] = records_for(p, steps=2)
    verdict = ops.can_implement(entry, **kw)
    assert not verdict.ok and "records.steps" in verdict.rules
    written = [t for n, t in kw.items() if n in ("state", "records") and
               isinstance(t, torch.Tensor)]
    before = [storage_bytes(t) for t in written]
    with pytest.raises(kdaguard.ContractViolation) as refused:
        call(**kw, error_word=word)
    assert refused.value.entry == entry and "records.steps" in refused.value.rules
    assert [storage_bytes(t) for t in written] == before
    assert int(word[0]) == 0


def test_can_implement_accepts_the_valid_record_calls():
    p = verify_problem(T=3)
    records = records_for(p)
    assert ops.can_implement("record_verify", **record_args(p, records)).ok
    assert ops.can_implement("replay_commit", records=records, state=p["state"],
                             cache_indices=p["cache_indices"],
                             accepted=torch.tensor([1, 0], dtype=torch.int32),
                             draft_token_num=3).ok
    assert ops.can_implement("accept_verify", **record_args(p, records),
                             prior_records=records_for(p),
                             prior_accepted=torch.tensor([1, 0], dtype=torch.int32)).ok


def test_record_schemas_and_opcheck():
    s = str(torch.ops.kdaguard.record_verify.default._schema)
    assert "Tensor(r!) records" in s and "Tensor(o!) out" in s and "Tensor state," in s
    s = str(torch.ops.kdaguard.replay_commit.default._schema)
    assert "Tensor(s!) state" in s and "Tensor records," in s
    s = str(torch.ops.kdaguard.accept_verify.default._schema)
    assert "Tensor(s!) state" in s and "Tensor(r!) records" in s and "Tensor prior_records" in s

    p = verify_problem(T=2)
    word = torch.zeros(1, dtype=torch.long)
    records = records_for(p).zero_()
    out = torch.empty(p["v"].shape, dtype=p["v"].dtype)
    tokens = (p["q"], p["k"], p["v"], None, p["g"], None, None, p["b"], None)
    torch.library.opcheck(torch.ops.kdaguard.record_verify.default,
                          (*tokens, p["cu_seqlens"], p["state"], p["cache_indices"], records, out,
                           word, 2), {"use_qk_l2norm": True})
    accepted = torch.tensor([2, 1], dtype=torch.int32)
    torch.library.opcheck(torch.ops.kdaguard.replay_commit.default,
                          (records, p["state"].clone(), p["cache_indices"], accepted, None, word,
                           2))
    torch.library.opcheck(torch.ops.kdaguard.accept_verify.default,
                          (*tokens, p["cu_seqlens"], p["state"].clone(), p["cache_indices"],
                           records, accepted, records_for(p).zero_(), out, word, 2),
                          {"use_qk_l2norm": True})


def test_record_step_compiles_fullgraph_with_the_eager_result():
    p = verify_problem(T=2, seed=7)
    accepted = torch.tensor([2, 1], dtype=torch.int32)

    def step(q, k, v, g, b, cu_seqlens, state, cache_indices, records):
        out = ops.record_verify(q, k, v, g=g, b=b, cu_seqlens=cu_seqlens, state=state,
                                cache_indices=cache_indices, records=records, draft_token_num=2,
                                use_qk_l2norm=True)
        ops.replay_commit(records=records, state=state, cache_indices=cache_indices,
                          accepted=accepted, draft_token_num=2)
        return out

    args = [p["q"], p["k"], p["v"], p["g"], p["b"], p["cu_seqlens"], p["state"],
            p["cache_indices"], records_for(p)]
    eager_state, eager_records = p["state"].clone(), records_for(p)
    expect = step(*args[:6], eager_state, args[7], eager_records)
    explain = torch._dynamo.explain(step)(*args[:6], p["state"].clone(), args[7], records_for(p))
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(*args)
    assert torch.equal(got, expect)
    assert torch.equal(p["state"], eager_state) and torch.equal(args[8], eager_records)


def test_record_ops_take_an_engines_leading_batch_dim_as_views():
    p = verify_problem(T=3, seed=8)
    want_records, got_records = records_for(p), records_for(p)
    want = ops.record_verify(**record_args(p, want_records))
    leading = {n: p[n].unsqueeze(0) for n in ("q", "k", "v", "g", "b")}
    out = torch.empty(1, *p["v"].shape, dtype=p["v"].dtype)
    got = ops.record_verify(**record_args({**p, **leading}, got_records), out=out)
    assert got.data_ptr() == out.data_ptr() and got.shape == want.shape
    assert torch.equal(got, want) and torch.equal(got_records, want_records)
