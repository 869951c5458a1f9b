#!/usr/bin/env python3
"""A rounding model of the f16 prefill: where the final state's error comes from.

The chunked form (kda-math.md) in f64, with f16 roundings at the points where the GPU kernels
round (prefill_prepare.cuh writes e^G q, e^(G_C - G) k, -W and A in f16; prefill_chain.cuh rounds
the state to f16 as the products' operand and Vnew before both of its products), each of which can
be switched on alone, and two points of the prepare kernel's own arithmetic ("LA split": L and A
from bf16 hi + lo tiles as the f16 kernel forms them; "solve f32": W and U by forward
substitution in f32), the cumulative gate as an f32 running sum in log2 units ("G f32": how the
prepare kernel formed it before the f16 kernel carried the sum's rounding error, kCompensatedGate;
after a strong token every later G is ~2e4, and its f32 rounding alone put the f16 state at up to
4x its floor), and the split chain ("split": spans of two chunks, each span's transition
from the identity and its Q from zero, the combine with E and the entering state rounded to f16
for their product), on calls drawn as the conformance generator draws the short softplus class
(properties/support/problem.cpp: q, v uniform in [-1, 1], L2-normed q and k, raw gate a uniform in
[-4, 4] with 5% strong tokens at 1000, exp(A_log) in [1, 16], dt log-uniform in [1e-3, 1e-1],
beta logits in [-3, 3], initial state uniform in [-1, 1]; 63 and 160 tokens, K = 128, V = 64).
Prints each variant's state and out error over their f16 rounding floors, as prefill_conformance
reports them (bench/NOTES_prefill.md, v9). --bounded LB draws F16NearItsRoundingFloor's bounded
class instead: g = LB / (1 + e^(-exp(A_log) (a + dt_bias))), A_log uniform in [-0.5, 0.5], a in
[-4, 4], no strong tokens, K = V = 128, sequences of 1000, 65, 17 and 2100 tokens.

--bf16 models the bf16 kernels instead (inputs, operands and floors in bf16; L and A as exact
products, the rounding of their bf16 tiles not modelled), with one more point, "U f16": U held in
f16 (relative to a power of two per value column, which changes no rounding but the range), as
against f32. --learned R draws calls where the state predicts v, the case where Vnew = U - W S
cancels most: keys from R fixed unit vectors, v = M k for a fixed M (plus 1% noise), weak decays
(g in [-1e-2, -1e-3]), 2100 tokens, K = V = 128.

    python3 bench/prefill_f16_model.py [seed] [--bounded LB] [--bf16] [--learned R]
"""
import argparse

import numpy as np

K, C = 128, 16
parser = argparse.ArgumentParser(description="A rounding model of the f16 prefill.")
parser.add_argument("seed", nargs="?", type=int, default=0)
parser.add_argument("--bounded", type=float, metavar="LB", help="the bounded gate at lower bound LB")
parser.add_argument("--bf16", action="store_true", help="the bf16 kernels' roundings and floors")
parser.add_argument("--learned", type=int, metavar="R", help="calls whose state predicts v (R keys)")
args = parser.parse_args()
V = 128 if args.bounded is not None or args.learned else 64
rng = np.random.default_rng(args.seed)


def r16(x):
    """x rounded to f16 (nearest even, subnormals kept), back in f64."""
    return x.astype(np.float16).astype(np.float64)


def rb16(x):
    """x rounded to bf16 (nearest even), back in f64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def r_operand(x):
    """x rounded to the kernels' 16-bit operand dtype (f16, or bf16 with --bf16)."""
    return rb16(x) if args.bf16 else r16(x)


def split_product(a, b):
    """a @ b.T as the f16 prepare kernel's tensor cores take it: each side split into bf16 hi + lo,
    the three products hi hi + hi lo + lo hi (kSplitTiles)."""
    ah, bh = rb16(a), rb16(b)
    al, bl = rb16(a - ah), rb16(b - bh)
    return ah @ bh.T + ah @ bl.T + al @ bh.T


def l2_normed(x):
    """Rows of x over their L2 norms, as the kernels' in-kernel norm forms them."""
    return x / np.sqrt((x * x).sum(1, keepdims=True) + 1e-6)


def draw(T, strong=0.05):
    if args.learned:
        return draw_learned(T)
    q = r_operand(rng.uniform(-1, 1, (T, K))); k = r_operand(rng.uniform(-1, 1, (T, K)))
    v = r_operand(rng.uniform(-1, 1, (T, V)))
    a = rng.uniform(-4, 4, (T, K)); a[rng.random((T, K)) < strong] = 1000.0; a = r_operand(a)
    rate = rng.uniform(1, 16) if args.bounded is None else np.exp(rng.uniform(-0.5, 0.5))
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), K)); bias = np.log(np.expm1(dt))
    x = a + bias
    if args.bounded is None:
        g = -rate * np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    else:
        g = args.bounded / (1 + np.exp(-rate * x))
    b = r_operand(rng.uniform(-3, 3, T)); beta = 1 / (1 + np.exp(-b))
    S0 = rng.uniform(-1, 1, (K, V)).astype(np.float32).astype(np.float64)
    return l2_normed(q) / np.sqrt(K), l2_normed(k), v, g, beta, S0


def draw_learned(T):
    """--learned: keys from a few fixed directions and v a fixed map of them, so that the state
    comes to predict v and Vnew = U - W S is a small difference of large terms."""
    keys = rng.normal(size=(args.learned, K)); M = rng.uniform(-1, 1, (V, K))
    idx = rng.integers(0, args.learned, T)
    kn = l2_normed(r_operand(keys[idx] + 0.01 * rng.normal(size=(T, K))))
    v = r_operand(kn @ M.T + 0.01 * rng.uniform(-1, 1, (T, V)))
    qn = l2_normed(r_operand(rng.uniform(-1, 1, (T, K)))) / np.sqrt(K)
    g = -rng.uniform(1e-3, 1e-2, (T, K))
    beta = 1 / (1 + np.exp(-r_operand(rng.uniform(0, 3, T))))
    S0 = np.zeros((K, V))
    return qn, kn, v, g, beta, S0


def exact(qn, kn, v, g, beta, S0):
    S = S0.copy(); out = []
    for t in range(len(g)):
        S = np.exp(g[t])[:, None] * S
        u = beta[t] * (v[t] - kn[t] @ S)
        S = S + np.outer(kn[t], u)
        out.append(qn[t] @ S)
    return S, np.array(out)

# The points the kernels round to f16: the state as the products' operand ("S"), Vnew, e^G q
# ("Qg"), e^(G_C - G) k ("Kd"), -W and A; "S stored" is not the kernels: the state itself rounded
# after every chunk, for scale.
KERNEL_ROUNDINGS = frozenset({"S", "Vnew", "Qg", "Kd", "W", "A"})


def rounded_at(rounded, point, x):
    """x rounded to the operand dtype (f16 for "U f16") when `point` is one of the rounding points
    in `rounded`."""
    if point not in rounded:
        return x
    return r16(x) if point == "U f16" else r_operand(x)


def chunk_operands(qn, kn, v, g, beta, c0, c1, rounded):
    """One chunk's operands as the prepare kernel leaves them: the decay to the chunk's end d, and
    e^G q, e^(G_C - G) k, -W, U and A, rounded at the points named in `rounded`."""
    n = c1 - c0
    if "G f32" in rounded:
        # the prepare kernel's cumulative gate: a running f32 sum of f32 gates in log2 units
        running, G2 = np.zeros(g.shape[1], np.float32), []
        for r in range(c0, c1):
            running = running + (g[r] * np.log2(np.e)).astype(np.float32)
            G2.append(running.copy())
        G = np.array(G2).astype(np.float64) / np.log2(np.e)
    else:
        G = np.cumsum(g[c0:c1], 0)
    Qg = qn[c0:c1] * np.exp(G); Kg = kn[c0:c1] * np.exp(G); Kd = kn[c0:c1] * np.exp(G[-1] - G)
    L = np.zeros((n, n)); A = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1):
            e = np.exp(G[i] - G[j])
            if j < i: L[i, j] = beta[c0 + i] * (kn[c0 + i] * kn[c0 + j] * e).sum()
            A[i, j] = (qn[c0 + i] * kn[c0 + j] * e).sum()
    # The pivot-factorised tiles (row p = 7) when every |G_i - G_p| is within 90 in log2 units.
    p = min(7, n - 1)
    if "LA split" in rounded and np.abs(G - G[p]).max() * np.log2(np.e) <= 90:
        up, down = np.exp(G - G[p]), np.exp(G[p] - G)
        Kp, Kn, Qp = kn[c0:c1] * up, kn[c0:c1] * down, qn[c0:c1] * up
        L = np.tril(beta[c0:c1, None] * split_product(Kp, Kn), -1)
        A = np.tril(split_product(Qp, Kn))
    if "solve f32" in rounded:
        # forward substitution in f32, a column of W or U per thread: X_i = y_i - sum L_ij X_j
        def solve(y):
            L32, X = L.astype(np.float32), (beta[c0:c1, None] * y).astype(np.float32)
            for i in range(n):
                for j in range(i):
                    X[i] = X[i] - L32[i, j] * X[j]
            return X.astype(np.float64)
        W, U = solve(Kg), solve(v[c0:c1])
    else:
        Tm = np.linalg.inv(np.eye(n) + L)
        W = Tm @ (beta[c0:c1, None] * Kg); U = Tm @ (beta[c0:c1, None] * v[c0:c1])
    return (np.exp(G[-1]), rounded_at(rounded, "Qg", Qg), rounded_at(rounded, "Kd", Kd),
            rounded_at(rounded, "W", W), rounded_at(rounded, "U f16", U),
            rounded_at(rounded, "A", A))


def chain_step(S, ops, rounded, U=None):
    """One chunk of the chain on S (K x columns): the state operand and Vnew rounded where
    `rounded` says; U replaces the chunk's own (zero for the transition's identity rows)."""
    d, Qg, Kd, W, U0, A = ops
    Sop = rounded_at(rounded, "S", S)
    Vop = rounded_at(rounded, "Vnew", (U0 if U is None else U) - W @ Sop)
    Sout = S if "S split for out" in rounded else Sop  # the output product's state operand
    return rounded_at(rounded, "S stored", d[:, None] * S + Kd.T @ Vop), Qg @ Sout + A @ Vop


def chunked(qn, kn, v, g, beta, S0, rounded, span=0):
    """The chunked form in f64 with f16 roundings at the points named in `rounded`. span > 0 runs
    the split chain (prefill_chain.cuh, prefill_combine.cuh) with spans of that many chunks: each
    span but the last from zero (Q) and from the identity (its transition M = diag(D) + E), the
    combine S_(j+1) = D S_j + E S_j + Q_j with E and S_j rounded to f16 for their product
    ("combine" in `rounded`), then every span again from its entering state, with the outputs."""
    T = len(g)
    ops = [chunk_operands(qn, kn, v, g, beta, c0, min(T, c0 + C), rounded) for c0 in range(0, T, C)]
    spans = [ops] if span <= 0 else [ops[i:i + span] for i in range(0, len(ops), span)]
    entering = [S0.copy()]
    for chunks in spans[:-1]:
        Q, M = np.zeros_like(S0), np.eye(S0.shape[0])
        for c in chunks:
            Q, _ = chain_step(Q, c, rounded)
            M, _ = chain_step(M, c, rounded, U=np.zeros((len(c[1]), M.shape[1])))
        D = np.prod([c[0] for c in chunks], axis=0)
        E, S = M - np.diag(D), entering[-1]
        product = r_operand(E) @ r_operand(S) if "combine" in rounded else E @ S
        entering.append(D[:, None] * S + product + Q)
    outs = []
    for chunks, S in zip(spans, entering):
        for c in chunks:
            S, o = chain_step(S, c, rounded)
            outs.append(o)
    return S, np.concatenate(outs)


def rel(x, ref):
    """rms(x - ref) / rms(ref), as the conformance test measures."""
    return np.sqrt(((x - ref) ** 2).mean() / (ref ** 2).mean())


def main():
    if args.bf16:
        variants = {"every kernel rounding": KERNEL_ROUNDINGS,
                    "all + U f16": KERNEL_ROUNDINGS | {"U f16"},
                    "U f16 alone": {"U f16"},
                    "Vnew alone": {"Vnew"},
                    "split, spans of 2": (KERNEL_ROUNDINGS | {"combine"}, 2),
                    "split + U f16": (KERNEL_ROUNDINGS | {"combine", "U f16"}, 2)}
    else:
        variants = {"every kernel rounding": KERNEL_ROUNDINGS}
        variants.update({f"{point} alone": {point} for point in sorted(KERNEL_ROUNDINGS)})
        variants["all but S"] = KERNEL_ROUNDINGS - {"S"}
        variants["all but Vnew"] = KERNEL_ROUNDINGS - {"Vnew"}
        variants["all but Qg"] = KERNEL_ROUNDINGS - {"Qg"}
        variants["all, S split for out"] = KERNEL_ROUNDINGS | {"S split for out"}
        variants["all + S stored"] = KERNEL_ROUNDINGS | {"S stored"}
        variants["LA split alone"] = {"LA split"}
        variants["solve f32 alone"] = {"solve f32"}
        variants["all + LA split + f32"] = KERNEL_ROUNDINGS | {"LA split", "solve f32"}
        variants["G f32 alone"] = {"G f32"}
        variants["all + G f32"] = KERNEL_ROUNDINGS | {"G f32"}
        variants["split, spans of 2"] = (KERNEL_ROUNDINGS | {"combine"}, 2)
        variants["split, combine alone"] = ({"combine"}, 2)
    rows = {name: [] for name in variants}
    if args.learned:
        lengths = (2100,) * 2
    else:
        lengths = (63,) * 3 + (160,) * 3 if args.bounded is None else (1000, 65, 17, 2100) * 2
    for T in lengths:
        d = draw(T, strong=0.05 if args.bounded is None else 0.0)
        Se, Oe = exact(*d)
        fs, fo = rel(r_operand(Se), Se), rel(r_operand(Oe), Oe)
        for name, variant in variants.items():
            rounded, span = variant if isinstance(variant, tuple) else (variant, 0)
            S, O = chunked(*d, rounded, span)
            rows[name].append((rel(S, Se) / fs, rel(O, Oe) / fo))
    for name, r in rows.items():
        r = np.array(r)
        print(f"{name:22s} state/floor mean {r[:, 0].mean():.2f} max {r[:, 0].max():.2f}   "
              f"out/floor mean {r[:, 1].mean():.2f} max {r[:, 1].max():.2f}")


if __name__ == "__main__":
    main()
