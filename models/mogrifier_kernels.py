"""Triton kernels: all rounds of a mogrifier step in one launch, forward and backward.

The reference mogrifier is a dozen small kernels per round (two matrix multiplies, the gate, the
product); on a GPU their launches, not their arithmetic, set the pace. Every batch row is mogrified
independently, so one program takes a tile of rows through every round, reading the low-rank
factors from L2 and keeping nothing but its own rows in flight.

Layouts (float32, row-major). A window of T steps and B rows keeps its mogrified values in
`values`: block j is a (T, B, D_j) array, D_j = E for even j (x) and H for odd j (h); block 0 is the
layer's inputs, block 1 the state-masked h, block r + 2 the result of round r (0-based). Round r
gates block r with a gate computed from block r + 1. `gates` and `d_pre` (the gradient of the gate
pre-activations) hold round r at block r with the same layout, and `z`, `d_z` (the rank-K
intermediate and its gradient) are (rounds, T, B, K). The weights of all rounds are concatenated:
`left` holds each round's (K, source) factor, `right` its (target, K) factor, `bias` its bias;
`left_t` and `right_t` the transposes, for the forward pass.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _x_h_offset(j: tl.constexpr, E: tl.constexpr, H: tl.constexpr):
    """Elements per (step, row) before block j when blocks alternate x (E wide) and h (H wide)."""
    return E * ((j + 1) // 2) + H * (j // 2)


@triton.jit
def _tile(batch, K: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr):
    """This program's batch rows, the rank columns, a chunk's column offsets, with their bounds."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    ks = tl.arange(0, BLOCK_K)
    return rows, rows < batch, ks, ks < K, tl.arange(0, CHUNK)


@triton.jit
def _store_rank_rows(array, r, step, window, batch, rows, row_ok, ks, k_ok, value, K: tl.constexpr):
    """Writes this program's rows of round r's (batch, K) slice of a (rounds, T, B, K) array at `step`."""
    tl.store(array + ((r * window + step) * batch + rows)[:, None] * K + ks[None, :], value,
             mask=row_ok[:, None] & k_ok[None, :])


@triton.jit
def _through_gate(grad, gate, gated):
    """The gradient of the gate's pre-activation, given that of gate * gated: d(2 sigma(p))/dp = 2 sigma (1 - sigma)."""
    return grad * gated * (gate - 0.5 * gate * gate)


@triton.jit
def mogrify_forward(values, gates, z, h, mask, left_t, right_t, bias, step, batch, window,
                    E: tl.constexpr, H: tl.constexpr, K: tl.constexpr, ROUNDS: tl.constexpr,
                    HAS_MASK: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
                    CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """One step: writes block 1 (h * mask) and, per round, its gate, z and result.

    Round r's loop over its target's columns gates them and, as each chunk of the result comes out,
    adds its share of round r + 1's z: one pass over the columns per round.
    """
    rows, row_ok, ks, k_ok, span = _tile(batch, K, BLOCK_B, BLOCK_K, CHUNK)
    per_step = window * batch

    h_seen = values + per_step * E + step * batch * H
    acc = tl.zeros([BLOCK_B, BLOCK_K], dtype=tl.float32)
    for c in range(0, H, CHUNK):
        cols = c + span
        col_ok = cols < H
        ok = row_ok[:, None] & col_ok[None, :]
        where = rows[:, None] * H + cols[None, :]
        value = tl.load(h + where, mask=ok, other=0.0)
        if HAS_MASK:
            value *= tl.load(mask + where, mask=ok, other=0.0)
        tl.store(h_seen + where, value, mask=ok)
        w = tl.load(left_t + cols[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(value, w, acc, input_precision=PRECISION)
    _store_rank_rows(z, 0, step, window, batch, rows, row_ok, ks, k_ok, acc, K)
    tl.debug_barrier()

    for r in tl.static_range(ROUNDS):
        TARGET = E * (1 - r % 2) + H * (r % 2)  # round r gates x (even r) with a gate made from h, or h from x
        offset = _x_h_offset(r, E, H)
        before = values + per_step * offset + step * batch * TARGET
        after = values + per_step * _x_h_offset(r + 2, E, H) + step * batch * TARGET
        gate_out = gates + per_step * offset + step * batch * TARGET
        factor = right_t + K * offset
        next_factor = left_t + K * _x_h_offset(r + 1, H, E)  # round r + 1 reads what this round writes
        next_acc = tl.zeros([BLOCK_B, BLOCK_K], dtype=tl.float32)
        for c in range(0, E * (1 - r % 2) + H * (r % 2), CHUNK):  # TARGET, spelt out for Triton 3.6's interpreter
            cols = c + span
            col_ok = cols < TARGET
            ok = row_ok[:, None] & col_ok[None, :]
            where = rows[:, None] * TARGET + cols[None, :]
            w = tl.load(factor + ks[:, None] * TARGET + cols[None, :], mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0)
            pre = tl.dot(acc, w, input_precision=PRECISION) + tl.load(bias + offset + cols, mask=col_ok,
                                                                       other=0.0)[None, :]
            gate = 2.0 * tl.sigmoid(pre)
            result = gate * tl.load(before + where, mask=ok, other=0.0)
            tl.store(gate_out + where, gate, mask=ok)
            tl.store(after + where, result, mask=ok)
            if r + 1 < ROUNDS:
                w = tl.load(next_factor + cols[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :],
                            other=0.0)
                next_acc = tl.dot(result, w, next_acc, input_precision=PRECISION)
        if r + 1 < ROUNDS:
            _store_rank_rows(z, r + 1, step, window, batch, rows, row_ok, ks, k_ok, next_acc, K)
        acc = next_acc
        tl.debug_barrier()


@triton.jit
def mogrify_backward(d_x, d_h, values, gates, d_pre, d_z, left, right, step, batch, window,
                     E: tl.constexpr, H: tl.constexpr, K: tl.constexpr, ROUNDS: tl.constexpr,
                     BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """One step, rounds in reverse: turns the gradients of the mogrified (x, h), updated in place in
    `d_x` and `d_h` (B, E) and (B, H), into those of the step's x and state-masked h, and writes each
    round's `d_pre` and `d_z` for the weight gradients.

    The last round's gate goes first; then each loop passes round r's gradient back into its source
    and, chunk by chunk, through round r - 1's gate, whose target that source is.
    """
    rows, row_ok, ks, k_ok, span = _tile(batch, K, BLOCK_B, BLOCK_K, CHUNK)
    per_step = window * batch

    LAST: tl.constexpr = ROUNDS - 1
    TARGET = E * (1 - LAST % 2) + H * (LAST % 2)
    if LAST % 2 == 0:
        d_target = d_x
    else:
        d_target = d_h
    offset = _x_h_offset(LAST, E, H)
    at_step = per_step * offset + step * batch * TARGET
    acc = tl.zeros([BLOCK_B, BLOCK_K], dtype=tl.float32)
    for c in range(0, E * (1 - LAST % 2) + H * (LAST % 2), CHUNK):  # TARGET
        cols = c + span
        col_ok = cols < TARGET
        ok = row_ok[:, None] & col_ok[None, :]
        where = rows[:, None] * TARGET + cols[None, :]
        gate = tl.load(gates + at_step + where, mask=ok, other=0.0)
        grad = tl.load(d_target + where, mask=ok, other=0.0)
        d_gate_pre = _through_gate(grad, gate, tl.load(values + at_step + where, mask=ok, other=0.0))
        tl.store(d_pre + at_step + where, d_gate_pre, mask=ok)
        tl.store(d_target + where, grad * gate, mask=ok)
        w = tl.load(right + K * offset + cols[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :],
                    other=0.0)
        acc = tl.dot(d_gate_pre, w, acc, input_precision=PRECISION)
    _store_rank_rows(d_z, LAST, step, window, batch, rows, row_ok, ks, k_ok, acc, K)
    tl.debug_barrier()

    for r in tl.static_range(ROUNDS - 1, -1, -1):
        SOURCE = H * (1 - r % 2) + E * (r % 2)  # also round r - 1's target
        if r % 2 == 0:
            d_source = d_h
        else:
            d_source = d_x
        factor = left + K * _x_h_offset(r, H, E)
        previous = _x_h_offset(r - 1, E, H)  # round r - 1's blocks
        at_step = per_step * previous + step * batch * SOURCE
        previous_factor = right + K * previous
        next_acc = tl.zeros([BLOCK_B, BLOCK_K], dtype=tl.float32)
        for c in range(0, H * (1 - r % 2) + E * (r % 2), CHUNK):  # SOURCE
            cols = c + span
            col_ok = cols < SOURCE
            ok = row_ok[:, None] & col_ok[None, :]
            where = rows[:, None] * SOURCE + cols[None, :]
            w = tl.load(factor + ks[:, None] * SOURCE + cols[None, :], mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0)
            grad = tl.load(d_source + where, mask=ok, other=0.0) + tl.dot(acc, w, input_precision=PRECISION)
            if r > 0:
                gate = tl.load(gates + at_step + where, mask=ok, other=0.0)
                d_gate_pre = _through_gate(grad, gate, tl.load(values + at_step + where, mask=ok, other=0.0))
                tl.store(d_pre + at_step + where, d_gate_pre, mask=ok)
                grad = grad * gate
                w = tl.load(previous_factor + cols[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :],
                            other=0.0)
                next_acc = tl.dot(d_gate_pre, w, next_acc, input_precision=PRECISION)
            tl.store(d_source + where, grad, mask=ok)
        if r > 0:
            _store_rank_rows(d_z, r - 1, step, window, batch, rows, row_ok, ks, k_ok, next_acc, K)
        acc = next_acc
        tl.debug_barrier()
