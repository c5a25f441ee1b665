"""Triton kernels: all rounds of a mogrifier step in one launch, forward and backward.

The reference mogrifier is a dozen small kernels per round (two matrix multiplies, the gate, the
product); on a GPU their launches, not their arithmetic, set the pace. Every batch row is mogrified
independently, so each program takes one row through every round, as float32 multiply-adds on
(CHUNK, K) tiles of the low-rank factors read from L2. A round is a few MFLOP for a whole batch: too
little for tensor cores to pay for the shuffling of their operands, and a row per program spreads a
batch of 32 over 32 SMs, where 16-row matrix-multiply tiles kept it on two (docs/benchmarks.md).

Layouts (float32, row-major). A window of T steps and B rows keeps its mogrified values in
`values`: block j is a (T, B, D_j) array, D_j = E for even j (x) and H for odd j (h); block 0 is the
layer's inputs, block 1 the state-masked h, block r + 2 the result of round r (0-based). Round r
gates block r with a gate computed from block r + 1. `gates` and `d_pre` (the gradient of the gate
pre-activations) hold round r at block r with the same layout, and `z`, `d_z` (the rank-K
intermediate and its gradient) are (rounds, T, B, K). The factors of all rounds are concatenated,
each stored (columns, K): `left_t` holds each round's (source, K) factor, the transpose of its
nn.Linear weight, `right` its (target, K) factor, as nn.Linear stores it, and `bias` its bias. Every
product is then a (CHUNK, K) tile times a column chunk or a rank vector broadcast over it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _x_h_offset(j: tl.constexpr, E: tl.constexpr, H: tl.constexpr):
    """Elements per (step, row) before block j when blocks alternate x (E wide) and h (H wide)."""
    return E * ((j + 1) // 2) + H * (j // 2)


@triton.jit
def _factor_tile(factor, cols, col_ok, ks, k_ok, K: tl.constexpr):
    """Rows `cols` of a (columns, K) factor: a (CHUNK, BLOCK_K) tile, zero outside the factor."""
    return tl.load(factor + cols[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)


@triton.jit
def _through_gate(grad, gate, gated):
    """The gradient of the gate's pre-activation, given that of gate * gated: d(2 sigma(p))/dp = 2 sigma (1 - sigma)."""
    return grad * gated * (gate - 0.5 * gate * gate)


@triton.jit
def mogrify_forward(values, gates, z, h, mask, left_t, right, bias, step, batch, window,
                    E: tl.constexpr, H: tl.constexpr, K: tl.constexpr, ROUNDS: tl.constexpr,
                    HAS_MASK: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr):
    """One step of one row (the program's): writes block 1 (h * mask) and, per round, its gate, z and result.

    Round r's loop over its target's columns gates them and, as each chunk of the result comes out,
    adds its products towards round r + 1's z: one pass over the columns per round. Products are
    summed over columns once per round, not per chunk.
    """
    row = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < K
    span = tl.arange(0, CHUNK)
    per_step = window * batch
    here = step * batch + row  # this row's (step, row) index in a (T, B, D) block

    products = tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32)
    for c in range(0, H, CHUNK):
        cols = c + span
        col_ok = cols < H
        value = tl.load(h + row * H + cols, mask=col_ok, other=0.0)
        if HAS_MASK:
            value *= tl.load(mask + row * H + cols, mask=col_ok, other=0.0)
        tl.store(values + per_step * E + here * H + cols, value, mask=col_ok)
        products += value[:, None] * _factor_tile(left_t, cols, col_ok, ks, k_ok, K)
    acc = tl.sum(products, axis=0)
    tl.store(z + here * K + ks, acc, mask=k_ok)
    tl.debug_barrier()

    for r in tl.static_range(ROUNDS):
        TARGET = E * (1 - r % 2) + H * (r % 2)  # round r gates x (even r) with a gate made from h, or h from x
        offset = _x_h_offset(r, E, H)
        before = values + per_step * offset + here * TARGET
        after = values + per_step * _x_h_offset(r + 2, E, H) + here * TARGET
        gate_out = gates + per_step * offset + here * TARGET
        factor = right + K * offset
        next_factor = left_t + K * _x_h_offset(r + 1, H, E)  # round r + 1 reads what this round writes
        products = tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32)
        for c in range(0, E * (1 - r % 2) + H * (r % 2), CHUNK):  # TARGET, spelt out for Triton 3.6's interpreter
            cols = c + span
            col_ok = cols < TARGET
            pre = tl.sum(acc[None, :] * _factor_tile(factor, cols, col_ok, ks, k_ok, K), axis=1)
            gate = 2.0 * tl.sigmoid(pre + tl.load(bias + offset + cols, mask=col_ok, other=0.0))
            result = gate * tl.load(before + cols, mask=col_ok, other=0.0)
            tl.store(gate_out + cols, gate, mask=col_ok)
            tl.store(after + cols, result, mask=col_ok)
            if r + 1 < ROUNDS:
                products += result[:, None] * _factor_tile(next_factor, cols, col_ok, ks, k_ok, K)
        if r + 1 < ROUNDS:
            acc = tl.sum(products, axis=0)
            tl.store(z + ((r + 1) * window * batch + here) * K + ks, acc, mask=k_ok)
        tl.debug_barrier()


@triton.jit
def mogrify_backward(d_x, d_h, values, gates, d_pre, d_z, left_t, right, step, batch, window,
                     E: tl.constexpr, H: tl.constexpr, K: tl.constexpr, ROUNDS: tl.constexpr,
                     BLOCK_K: tl.constexpr, CHUNK: tl.constexpr):
    """One step of one row, rounds in reverse: turns the gradients of the mogrified (x, h), updated in
    place in `d_x` and `d_h` (B, E) and (B, H), into those of the step's x and state-masked h, and
    writes each round's `d_pre` and `d_z` for the weight gradients.

    The last round's gate goes first; then each loop passes round r's gradient back into its source
    and, chunk by chunk, through round r - 1's gate, whose target that source is.
    """
    row = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    k_ok = ks < K
    span = tl.arange(0, CHUNK)
    per_step = window * batch
    here = step * batch + row

    LAST: tl.constexpr = ROUNDS - 1
    TARGET = E * (1 - LAST % 2) + H * (LAST % 2)
    if LAST % 2 == 0:
        d_target = d_x + row * E
    else:
        d_target = d_h + row * H
    offset = _x_h_offset(LAST, E, H)
    at_step = per_step * offset + here * TARGET
    products = tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32)
    for c in range(0, E * (1 - LAST % 2) + H * (LAST % 2), CHUNK):  # TARGET
        cols = c + span
        col_ok = cols < TARGET
        gate = tl.load(gates + at_step + cols, mask=col_ok, other=0.0)
        grad = tl.load(d_target + cols, mask=col_ok, other=0.0)
        d_gate_pre = _through_gate(grad, gate, tl.load(values + at_step + cols, mask=col_ok, other=0.0))
        tl.debug_barrier()  # threads holding copies of a column read it before its owner overwrites it
        tl.store(d_pre + at_step + cols, d_gate_pre, mask=col_ok)
        tl.store(d_target + cols, grad * gate, mask=col_ok)
        products += d_gate_pre[:, None] * _factor_tile(right + K * offset, cols, col_ok, ks, k_ok, K)
    acc = tl.sum(products, axis=0)
    tl.store(d_z + (LAST * window * batch + here) * K + ks, acc, mask=k_ok)
    tl.debug_barrier()

    for r in tl.static_range(ROUNDS - 1, -1, -1):
        SOURCE = H * (1 - r % 2) + E * (r % 2)  # also round r - 1's target
        if r % 2 == 0:
            d_source = d_h + row * H
        else:
            d_source = d_x + row * E
        factor = left_t + K * _x_h_offset(r, H, E)
        previous = _x_h_offset(r - 1, E, H)  # round r - 1's blocks
        at_step = per_step * previous + here * SOURCE
        products = tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32)
        for c in range(0, H * (1 - r % 2) + E * (r % 2), CHUNK):  # SOURCE
            cols = c + span
            col_ok = cols < SOURCE
            grad = (tl.load(d_source + cols, mask=col_ok, other=0.0)
                    + tl.sum(acc[None, :] * _factor_tile(factor, cols, col_ok, ks, k_ok, K), axis=1))
            if r > 0:
                gate = tl.load(gates + at_step + cols, mask=col_ok, other=0.0)
                d_gate_pre = _through_gate(grad, gate, tl.load(values + at_step + cols, mask=col_ok, other=0.0))
                tl.store(d_pre + at_step + cols, d_gate_pre, mask=col_ok)
                grad = grad * gate
                products += d_gate_pre[:, None] * _factor_tile(right + K * previous, cols, col_ok, ks, k_ok, K)
            tl.debug_barrier()  # as above: every copy of the chunk's gradients is read before it is overwritten
            tl.store(d_source + cols, grad, mask=col_ok)
        if r > 0:
            acc = tl.sum(products, axis=0)
            tl.store(d_z + ((r - 1) * window * batch + here) * K + ks, acc, mask=k_ok)
        tl.debug_barrier()
