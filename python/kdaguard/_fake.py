"""Fake (meta) implementations for torch.compile: the mutating ops return nothing and the query
ops return the empty verdict, so tracing needs no data. Validation runs when the op runs."""

import torch


def _mutates_only(*args, **kwargs):
    return None


for _name in ("decode", "prefill", "verify", "commit", "record_verify", "replay_commit",
              "accept_verify"):
    torch.library.register_fake(f"kdaguard::{_name}")(_mutates_only)
