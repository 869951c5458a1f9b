"""An independent pure-torch f64 KDA recurrence (shared/spec/kda-math.md, "Per token"), written
for these tests: it shares no code with kdaguard's reference."""

import math

import torch


def gate_values(*, a=None, g=None, A_log=None, dt_bias=None, lower_bound=None):
    """g [T, HV, K] in f64 from a raw gate a (softplus or bounded) or an activated g."""
    if g is not None:
        return g.double()
    x = a.double()
    T, HV, K = x.shape
    if dt_bias is not None:
        x = x + dt_bias.double().view(HV, K)
    rate = torch.exp(A_log.double()).view(1, HV, 1)
    if lower_bound is None:
        return -rate * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    return lower_bound * torch.sigmoid(rate * x)


def beta_values(*, b=None, beta=None):
    return torch.sigmoid(b.double()) if b is not None else beta.double()


def token_step(S, q, k, v, g, beta, scale, l2norm):
    """One token for one (row, value head): S [V, K] f64, q/k [K], v [V], g [K]; returns o, S."""
    if l2norm:
        q = q / torch.sqrt((q * q).sum() + 1e-6)
        k = k / torch.sqrt((k * k).sum() + 1e-6)
    q = q * scale
    S = S * torch.exp(g)[None, :]
    u = beta * (v - S @ k)
    S = S + u[:, None] * k[None, :]
    return S @ q, S


def run_rows(states, q, k, v, g, beta, *, scale=None, l2norm=False, row_of_token):
    """Per-token recurrence over tokens grouped in rows. states: dict row -> [HV, V, K] f64
    (updated); q/k [T, H, K], v [T, HV, V], g [T, HV, K], beta [T, HV]; returns o [T, HV, V]."""
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    scale = K ** -0.5 if scale is None else scale
    o = torch.zeros(T, HV, V, dtype=torch.float64)
    q, k, v = q.double(), k.double(), v.double()
    for t in range(T):
        row = row_of_token[t]
        if row is None:
            continue
        for hv in range(HV):
            h = hv // (HV // H)
            o[t, hv], states[row][hv] = token_step(states[row][hv], q[t, h], k[t, h], v[t, hv],
                                                   g[t, hv], beta[t, hv], scale, l2norm)
    return o


def rms_ratio(actual, expected):
    actual, expected = actual.double(), expected.double()
    if not torch.isfinite(actual).all():
        return math.inf
    err = (actual - expected).abs()
    if err.numel() == 0 or err.max() <= 1e-6:
        return 0.0
    return float(torch.sqrt((err * err).mean()) / torch.sqrt((expected * expected).mean()))
