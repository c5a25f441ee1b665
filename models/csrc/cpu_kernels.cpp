// The fast path's CPU kernels: all rounds of a mogrifier step in one call, and the LSTM's element-wise
// update, forward and backward, with the batch rows split among torch's threads; and loops over a whole
// window (an LSTM, an mLSTM, an RLSTM, each but the mLSTM plain or behind a mogrifier) that call them and the
// recurrent products step by step.
//
// Every batch row runs through a window independently, so the window loops give each thread a slice of the rows for
// the whole window (for_batch_slices), with single-threaded matrix multiplies: one fork per window instead of
// one per operation, no Python between the operations, and the element-wise work of a mogrifier round in one
// pass. Called on its own (the Python loop's steps), a mogrifier step or an update splits its rows the same way.
// The mogrifier's layout is models/mogrifier_kernels.py's: value block j holds (T, B, D_j), block 0 the inputs,
// block 1 the state-masked h, block r + 2 round r's result; gates, d_pre hold round r at block r; z, d_z are
// (rounds, T, B, K).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/python.h>

#include <vector>

namespace {

using Tensors = std::vector<at::Tensor>;

// gate <- 2 gate (gate holds sigma(p)); after <- gate * before.
template <typename T>
void gate_and_apply(T* __restrict__ gate, const T* __restrict__ before, T* __restrict__ after, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T g = 2 * gate[i];
    gate[i] = g;
    after[i] = g * before[i];
  }
}

// d_pre <- d_target * before * d(2 sigma(p))/dp, with d(2 sigma(p))/dp = 2 sigma (1 - sigma) = g - g^2 / 2;
// d_target <- d_target * gate.
template <typename T>
void through_gate(const T* __restrict__ gate, const T* __restrict__ before, T* __restrict__ d_target,
                  T* __restrict__ d_pre, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i], d = d_target[i];
    d_pre[i] = d * before[i] * (g - g * g / 2);
    d_target[i] = d * g;
  }
}

// `t` itself where its columns are contiguous (rows may be slices of wider ones), else a contiguous copy.
at::Tensor with_contiguous_columns(const at::Tensor& t) { return t.stride(1) == 1 ? t : t.contiguous(); }

// Runs body(first_row, rows) on one slice of the batch per thread. Splitting paid even at one row per
// thread (2 threads, E = H = 512, k = 40: a step 1.2x faster at batch 2, 1.3x at batch 32). Worker
// threads do not inherit the caller's grad mode, and inputs may require grad: no thread records any.
template <typename Body>
void for_row_slices(int64_t batch, const Body& body) {
  const int64_t threads = at::get_num_threads();
  at::parallel_for(0, batch, (batch + threads - 1) / threads, [&](int64_t begin, int64_t end) {
    at::NoGradGuard no_grad;
    body(begin, end - begin);
  });
}

// One thread's rows of the batch, [first, first + count): its slice of a (B, ...) tensor, or of step t of a
// (T, B, ...) one; contiguous where the tensor is.
struct RowRange {
  int64_t first, count;

  at::Tensor of(const at::Tensor& t) const { return t.narrow(0, first, count); }
  c10::optional<at::Tensor> of(const c10::optional<at::Tensor>& mask) const {  // a (1, H) mask serves every row
    return mask.has_value() && mask->size(0) > 1 ? c10::optional<at::Tensor>(of(*mask)) : mask;
  }
  at::Tensor at(const at::Tensor& window, int64_t t) const { return window.select(0, t).narrow(0, first, count); }
};

// Runs a window's whole loop over time once per slice of the batch, one slice per thread. A row's steps read only
// that row, so the threads never wait for each other inside the window, and each runs its products and updates on
// its own (ATen, oneDNN and the BLAS take one thread inside a parallel region). Split step by step instead, both
// threads met several times per step, and a thread that another process kept off its core held the other one up
// at each meeting: an LSTM layer's forward window took 32 ms split by rows and 556 ms split by steps, with another
// process busy on one of the two cores (Zen 4).
template <typename Loop>
void for_batch_slices(int64_t batch, const Loop& loop) {
  for_row_slices(batch, [&](int64_t first, int64_t count) { loop(RowRange{first, count}); });
}

// The forward loops' frame: per slice of the batch, the steps from the first to the last, each
// `step(t, rows, h, keep)` turning the h before it (unmasked; `keep` is the rows' state mask) into its output.
template <typename Step>
void forward_through_time(int64_t steps, const at::Tensor& h0, const c10::optional<at::Tensor>& mask,
                          const Step& step) {
  for_batch_slices(h0.size(0), [&](const RowRange& rows) {
    const c10::optional<at::Tensor> keep = rows.of(mask);
    at::Tensor h = rows.of(h0).contiguous();
    for (int64_t t = 0; t < steps; ++t) h = step(t, rows, h, keep);
  });
}

// The backward loops' frame: per slice of the batch, the steps from the last to the first, each
// `step(t, rows, dh, dc)` turning the gradients of its h (the output's included) and c into those of the h its
// products read and of c before it; the state mask is applied here. Returns the gradients of h0 and c0.
template <typename Step>
Tensors backward_through_time(int64_t steps, const at::Tensor& dh_last, const at::Tensor& dc_last,
                              const c10::optional<at::Tensor>& mask, const Step& step) {
  const at::Tensor dh_first = at::empty_like(dh_last), dc_first = at::empty_like(dc_last);
  for_batch_slices(dh_last.size(0), [&](const RowRange& rows) {
    const c10::optional<at::Tensor> keep = rows.of(mask);
    at::Tensor dh = rows.of(dh_last), dc = rows.of(dc_last);
    for (int64_t t = steps - 1; t >= 0; --t) {
      step(t, rows, dh, dc);
      if (keep.has_value()) dh = dh * *keep;
    }
    rows.of(dh_first).copy_(dh);
    rows.of(dc_first).copy_(dc);
  });
  return {dh_first, dc_first};
}

// Where one step's update (lstm_update_into) writes: contiguous (B, H) tensors but `activations` (B, 4H), which
// holds sigma(i, f, o) and sigma(2 j). The window loops pass one step of window-sized tensors.
struct UpdateOutputs {
  at::Tensor h, c, activations, j, i_used, tanh_c;
};

// The LSTM's element-wise update (models.cells.lstm_update) on gate pre-activations x_term + h_term,
// ordered (i, f, o, j) by columns, which may be column slices of wider rows. tanh(x) is computed as
// 2 sigma(2x) - 1, as in Python, through ATen's vectorised sigmoid; everything else in one pass per row.
void lstm_update_into(const at::Tensor& x_term_in, const at::Tensor& h_term_in, const at::Tensor& c_prev_in,
                      bool cap_input_gate, const UpdateOutputs& out) {
  const at::Tensor x_term = with_contiguous_columns(x_term_in), h_term = with_contiguous_columns(h_term_in);
  const at::Tensor c_prev = c_prev_in.contiguous();
  const int64_t batch = c_prev.size(0), hidden = c_prev.size(1);
  const at::Tensor &activations = out.activations, &h = out.h, &c = out.c, &j = out.j, &i_used = out.i_used;
  const at::Tensor& tanh_c = out.tanh_c;
  AT_DISPATCH_FLOATING_TYPES(c_prev.scalar_type(), "lstm_update", [&] {
    using T = scalar_t;
    for_row_slices(batch, [&](int64_t first, int64_t rows) {
      for (int64_t row = first; row < first + rows; ++row) {
        const T* __restrict__ x = x_term.data_ptr<T>() + row * x_term.stride(0);
        const T* __restrict__ y = h_term.data_ptr<T>() + row * h_term.stride(0);
        T* __restrict__ a = activations.data_ptr<T>() + row * 4 * hidden;
        for (int64_t k = 0; k < 3 * hidden; ++k) a[k] = x[k] + y[k];
        for (int64_t k = 3 * hidden; k < 4 * hidden; ++k) a[k] = 2 * (x[k] + y[k]);
      }
      at::Tensor slice = activations.narrow(0, first, rows);
      at::sigmoid_out(slice, slice);
      for (int64_t row = first; row < first + rows; ++row) {
        const int64_t at_row = row * hidden;
        const T* __restrict__ a = activations.data_ptr<T>() + row * 4 * hidden;
        const T* __restrict__ cp = c_prev.data_ptr<T>() + at_row;
        T* __restrict__ jj = j.data_ptr<T>() + at_row;
        T* __restrict__ iu = i_used.data_ptr<T>() + at_row;
        T* __restrict__ cc = c.data_ptr<T>() + at_row;
        T* __restrict__ twice_c = tanh_c.data_ptr<T>() + at_row;
        for (int64_t k = 0; k < hidden; ++k) {
          const T i = a[k], f = a[hidden + k], g = 2 * a[3 * hidden + k] - 1;
          const T used = cap_input_gate ? std::min(i, 1 - f) : i;
          const T cell = f * cp[k] + used * g;
          jj[k] = g;
          iu[k] = used;
          cc[k] = cell;
          twice_c[k] = 2 * cell;
        }
      }
      at::Tensor tanh_slice = tanh_c.narrow(0, first, rows);
      at::sigmoid_out(tanh_slice, tanh_slice);
      for (int64_t row = first; row < first + rows; ++row) {
        const T* __restrict__ o = activations.data_ptr<T>() + row * 4 * hidden + 2 * hidden;
        T* __restrict__ t = tanh_c.data_ptr<T>() + row * hidden;
        T* __restrict__ hh = h.data_ptr<T>() + row * hidden;
        for (int64_t k = 0; k < hidden; ++k) {
          t[k] = 2 * t[k] - 1;
          hh[k] = o[k] * t[k];
        }
      }
    });
  });
}

// lstm_update_into's results in tensors of their own: h, c, sigma(i, f, o) (B, 3H), j, the input gate used and
// tanh(c).
std::vector<at::Tensor> lstm_update(const at::Tensor& x_term, const at::Tensor& h_term, const at::Tensor& c_prev,
                                    bool cap_input_gate) {
  const int64_t batch = c_prev.size(0), hidden = c_prev.size(1);
  const auto empty = [&](int64_t width) { return at::empty({batch, width}, c_prev.options()); };
  const UpdateOutputs out{empty(hidden), empty(hidden), empty(4 * hidden), empty(hidden), empty(hidden), empty(hidden)};
  lstm_update_into(x_term, h_term, c_prev, cap_input_gate, out);
  return {out.h, out.c, out.activations.narrow(1, 0, 3 * hidden), out.j, out.i_used, out.tanh_c};
}

// Its gradient (models.cells.lstm_update_backward): those of the gate pre-activations, written to `d_gates`
// (B, 4H, contiguous), and of c_prev, returned, given those of h and c.
at::Tensor lstm_update_backward_into(const at::Tensor& sigmoids_in, const at::Tensor& j_in,
                                     const at::Tensor& i_used_in, const at::Tensor& c_prev_in,
                                     const at::Tensor& tanh_c_in, const at::Tensor& dh_in, const at::Tensor& dc_in,
                                     bool cap_input_gate, const at::Tensor& d_gates) {
  const at::Tensor sigmoids = with_contiguous_columns(sigmoids_in);
  const at::Tensor j = j_in.contiguous(), i_used = i_used_in.contiguous(), c_prev = c_prev_in.contiguous();
  const at::Tensor tanh_c = tanh_c_in.contiguous(), dh = dh_in.contiguous(), dc = dc_in.contiguous();
  const int64_t batch = dh.size(0), hidden = dh.size(1);
  at::Tensor dc_prev = at::empty_like(dh);
  AT_DISPATCH_FLOATING_TYPES(dh.scalar_type(), "lstm_update_backward", [&] {
    using T = scalar_t;
    for_row_slices(batch, [&](int64_t first, int64_t rows) {
      for (int64_t row = first; row < first + rows; ++row) {
        const int64_t at_row = row * hidden;
        const T* __restrict__ s = sigmoids.data_ptr<T>() + row * sigmoids.stride(0);
        const T *__restrict__ jj = j.data_ptr<T>() + at_row, *__restrict__ iu = i_used.data_ptr<T>() + at_row;
        const T *__restrict__ cp = c_prev.data_ptr<T>() + at_row, *__restrict__ t = tanh_c.data_ptr<T>() + at_row;
        const T *__restrict__ gh = dh.data_ptr<T>() + at_row, *__restrict__ gc = dc.data_ptr<T>() + at_row;
        T* __restrict__ dg = d_gates.data_ptr<T>() + row * 4 * hidden;
        T* __restrict__ dcp = dc_prev.data_ptr<T>() + at_row;
        for (int64_t k = 0; k < hidden; ++k) {
          const T i = s[k], f = s[hidden + k], o = s[2 * hidden + k];
          const T d_c = gc[k] + gh[k] * o * (1 - t[k] * t[k]);
          T d_i = d_c * jj[k], d_f = d_c * cp[k];
          if (cap_input_gate && iu[k] < i) {  // min(i, 1 - f) took 1 - f: its gradient goes to f, negated
            d_f -= d_i;
            d_i = 0;
          }
          dg[k] = d_i * i * (1 - i);
          dg[hidden + k] = d_f * f * (1 - f);
          dg[2 * hidden + k] = gh[k] * t[k] * o * (1 - o);
          dg[3 * hidden + k] = d_c * iu[k] * (1 - jj[k] * jj[k]);
          dcp[k] = d_c * f;
        }
      }
    });
  });
  return dc_prev;
}

std::vector<at::Tensor> lstm_update_backward(const at::Tensor& sigmoids, const at::Tensor& j, const at::Tensor& i_used,
                                             const at::Tensor& c_prev, const at::Tensor& tanh_c, const at::Tensor& dh,
                                             const at::Tensor& dc, bool cap_input_gate) {
  at::Tensor d_gates = at::empty({dh.size(0), 4 * dh.size(1)}, dh.options());
  at::Tensor dc_prev = lstm_update_backward_into(sigmoids, j, i_used, c_prev, tanh_c, dh, dc, cap_input_gate, d_gates);
  return {d_gates, dc_prev};
}

// h @ W^T (+ bias) for the LSTM's window loops: through oneDNN (torch.ops.mkldnn._linear_pointwise) with `weight`
// packed by models/tape.py, else `weight` is a plain (out, in) matrix for at::mm.
at::Tensor recurrent_product(const at::Tensor& inputs, const at::Tensor& weight, bool onednn,
                             const c10::optional<at::Tensor>& bias = c10::nullopt) {
  if (!onednn) return bias.has_value() ? at::addmm(*bias, inputs, weight.t()) : at::mm(inputs, weight.t());
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack{inputs, weight, bias.has_value() ? c10::IValue(*bias) : c10::IValue(),
                                 std::string("none"), c10::List<c10::optional<at::Scalar>>(),
                                 c10::optional<std::string>("")};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// A backward product: gradients times a weight as the backward loops take it, transposed and packed for oneDNN,
// else the plain (out, in) weight for at::mm.
at::Tensor gradient_product(const at::Tensor& grads, const at::Tensor& weight_t, bool onednn) {
  return onednn ? recurrent_product(grads, weight_t, true) : at::mm(grads, weight_t);
}

// What the window loops keep of every step's update, written in place: the outputs h, c before each step and after
// the last (c0 first), and the update's caches (models.cells.lstm_update's order), each over the whole window.
struct UpdateRecord {
  at::Tensor outputs, cells, activations, j, i_used, tanh_c;

  UpdateRecord(int64_t steps, const at::Tensor& c0)
      : outputs(at::empty({steps, c0.size(0), c0.size(1)}, c0.options())),
        cells(at::empty({steps + 1, c0.size(0), c0.size(1)}, c0.options())),
        activations(at::empty({steps, c0.size(0), 4 * c0.size(1)}, c0.options())),
        j(at::empty_like(outputs)), i_used(at::empty_like(outputs)), tanh_c(at::empty_like(outputs)) {
    cells.select(0, 0).copy_(c0);
  }

  // Runs step t's update for the batch rows `rows` and returns their h.
  at::Tensor add(int64_t t, const RowRange& rows, const at::Tensor& x_term, const at::Tensor& h_term,
                 bool cap_input_gate) {
    lstm_update_into(x_term, h_term, rows.at(cells, t), cap_input_gate,
                     {rows.at(outputs, t), rows.at(cells, t + 1), rows.at(activations, t), rows.at(j, t),
                      rows.at(i_used, t), rows.at(tanh_c, t)});
    return rows.at(outputs, t);
  }

  // The outputs, the cells and the caches, with sigma(i, f, o) as (T, B, 3H).
  Tensors results() const {
    return {outputs, cells, activations.narrow(2, 0, 3 * outputs.size(2)), j, i_used, tanh_c};
  }
};

// h times the state mask (h itself without one), written to `h_seen`.
void masked_into(at::Tensor h_seen, const at::Tensor& h, const c10::optional<at::Tensor>& mask) {
  if (mask.has_value()) {
    at::mul_out(h_seen, h, *mask);
  } else {
    h_seen.copy_(h);
  }
}

// The LSTM over a whole window (models/lstm_window.py): per step, h times the state mask, its product with the
// recurrent weight, and the update above, with no Python between steps. x_part (T, B, 4H) holds the input side
// of every step (one matrix multiply over the window, made by the caller). Returns the outputs, the masked h
// each step's product read, c before each step and after the last (T + 1 of them), and the update's caches.
std::vector<at::Tensor> lstm_window_forward(const at::Tensor& x_part, const at::Tensor& h0, const at::Tensor& c0,
                                            const at::Tensor& weight, bool onednn,
                                            const c10::optional<at::Tensor>& mask, bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = x_part.size(0);
  UpdateRecord record(steps, c0);
  const at::Tensor h_seen = at::empty_like(record.outputs);
  forward_through_time(steps, h0, mask, [&](int64_t t, const RowRange& rows, const at::Tensor& h,
                                            const c10::optional<at::Tensor>& keep) {
    masked_into(rows.at(h_seen, t), h, keep);
    const at::Tensor h_term = recurrent_product(rows.at(h_seen, t), weight, onednn);
    return record.add(t, rows, rows.at(x_part, t), h_term, cap_input_gate);
  });
  Tensors results = record.results();
  results.insert(results.begin() + 1, h_seen);
  return results;
}

// Its backward through time: the gate pre-activation gradients of every step (T, B, 4H) and those of h0 and c0,
// given those of the outputs and of the last (h, c). `weight_t` is the recurrent weight's transpose, packed
// for oneDNN, else the plain (4H, H) weight for at::mm.
std::vector<at::Tensor> lstm_window_backward(const at::Tensor& d_outputs, const at::Tensor& dh_last,
                                             const at::Tensor& dc_last, const at::Tensor& cells,
                                             const at::Tensor& sigmoids, const at::Tensor& j,
                                             const at::Tensor& i_used, const at::Tensor& tanh_c,
                                             const at::Tensor& weight_t, bool onednn,
                                             const c10::optional<at::Tensor>& mask, bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = d_outputs.size(0);
  const at::Tensor d_gates = at::empty({steps, dh_last.size(0), 4 * dh_last.size(1)}, dh_last.options());
  Tensors first = backward_through_time(steps, dh_last, dc_last, mask, [&](int64_t t, const RowRange& rows,
                                                                            at::Tensor& dh, at::Tensor& dc) {
    const at::Tensor d_gates_t = rows.at(d_gates, t);
    dc = lstm_update_backward_into(rows.at(sigmoids, t), rows.at(j, t), rows.at(i_used, t), rows.at(cells, t),
                                   rows.at(tanh_c, t), dh + rows.at(d_outputs, t), dc, cap_input_gate, d_gates_t);
    dh = gradient_product(d_gates_t, weight_t, onednn);
  });
  return {d_gates, first[0], first[1]};
}

// The mLSTM's window (Krause, eq. 3.5-3.9; models.cells.MLSTMCell): per step m = (W_mx x) * (W_mh h), the gates'
// product with m and the update. x_part (T, B, 5H) holds every step's input side: the gates' (4H), then W_mx x.
// Returns the outputs, the masked h and the m each step's products read, W_mh h, c before each step and after
// the last, and the update's caches.
std::vector<at::Tensor> mlstm_window_forward(const at::Tensor& x_part, const at::Tensor& h0, const at::Tensor& c0,
                                             const at::Tensor& hidden_factor, const at::Tensor& weight,
                                             const at::Tensor& bias, bool onednn,
                                             const c10::optional<at::Tensor>& mask, bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = x_part.size(0), hidden = h0.size(1);
  UpdateRecord record(steps, c0);
  const at::Tensor h_seen = at::empty_like(record.outputs), factor_h = at::empty_like(record.outputs);
  const at::Tensor m = at::empty_like(record.outputs);
  forward_through_time(steps, h0, mask, [&](int64_t t, const RowRange& rows, const at::Tensor& h,
                                            const c10::optional<at::Tensor>& keep) {
    const at::Tensor x_t = rows.at(x_part, t), factor_h_t = rows.at(factor_h, t);
    masked_into(rows.at(h_seen, t), h, keep);
    factor_h_t.copy_(recurrent_product(rows.at(h_seen, t), hidden_factor, onednn));
    at::Tensor m_t = rows.at(m, t);
    at::mul_out(m_t, x_t.narrow(1, 4 * hidden, hidden), factor_h_t);
    const at::Tensor h_term = recurrent_product(m_t, weight, onednn, bias);
    return record.add(t, rows, x_t.narrow(1, 0, 4 * hidden), h_term, cap_input_gate);
  });
  Tensors results = record.results();
  results.insert(results.begin() + 1, {h_seen, m, factor_h});
  return results;
}

// Its backward through time: the gradients of x_part (T, B, 5H), of the gates' pre-activations (T, B, 4H), of
// W_mh h (times W_mx x: what W_mh's gradient reads), of h0 and of c0.
std::vector<at::Tensor> mlstm_window_backward(const at::Tensor& d_outputs, const at::Tensor& dh_last,
                                              const at::Tensor& dc_last, const at::Tensor& x_part,
                                              const at::Tensor& factor_h, const at::Tensor& cells,
                                              const at::Tensor& sigmoids, const at::Tensor& j,
                                              const at::Tensor& i_used, const at::Tensor& tanh_c,
                                              const at::Tensor& hidden_factor_t, const at::Tensor& weight_t,
                                              bool onednn, const c10::optional<at::Tensor>& mask,
                                              bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = d_outputs.size(0), batch = dh_last.size(0), hidden = dh_last.size(1);
  const at::Tensor d_x_part = at::empty({steps, batch, 5 * hidden}, dh_last.options());  // the gates', then W_mx x's
  const at::Tensor d_gates = d_x_part.narrow(2, 0, 4 * hidden);
  const at::Tensor d_factor_h = at::empty({steps, batch, hidden}, dh_last.options());
  Tensors first = backward_through_time(steps, dh_last, dc_last, mask, [&](int64_t t, const RowRange& rows,
                                                                            at::Tensor& dh, at::Tensor& dc) {
    const at::Tensor d_gates_t = at::empty({rows.count, 4 * hidden}, dh_last.options());
    dc = lstm_update_backward_into(rows.at(sigmoids, t), rows.at(j, t), rows.at(i_used, t), rows.at(cells, t),
                                   rows.at(tanh_c, t), dh + rows.at(d_outputs, t), dc, cap_input_gate, d_gates_t);
    rows.at(d_gates, t).copy_(d_gates_t);
    const at::Tensor d_m = gradient_product(d_gates_t, weight_t, onednn);
    at::Tensor d_factor_x_t = rows.at(d_x_part, t).narrow(1, 4 * hidden, hidden);
    at::Tensor d_factor_h_t = rows.at(d_factor_h, t);
    at::mul_out(d_factor_x_t, d_m, rows.at(factor_h, t));
    at::mul_out(d_factor_h_t, d_m, rows.at(x_part, t).narrow(1, 4 * hidden, hidden));
    dh = gradient_product(d_factor_h_t, hidden_factor_t, onednn);
  });
  return {d_x_part, d_gates, d_factor_h, first[0], first[1]};
}

// The BLAS torch's CPU library exports where it has one (MKL, in the x86-64 Linux wheels), resolved when the
// kernels load; weak, so that a torch without it leaves them null and small_product takes at::mm.
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc) __attribute__((weak));
}

template <typename T>
using GemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const T*, const T*, const int*,
                        const T*, const int*, const T*, T*, const int*);

// Null where torch exports no BLAS, or where the build defines LM_TUNER_NO_EXPORTED_BLAS (how the tests take
// the at::mm path on a machine that has one).
template <typename T>
GemmFn<T> exported_gemm();
#ifdef LM_TUNER_NO_EXPORTED_BLAS
template <>
GemmFn<float> exported_gemm<float>() { return nullptr; }
template <>
GemmFn<double> exported_gemm<double>() { return nullptr; }
#else
template <>
GemmFn<float> exported_gemm<float>() { return sgemm_; }
template <>
GemmFn<double> exported_gemm<double>() { return dgemm_; }
#endif

// out (rows, n) = a (rows, k) times b (k, n), plus beta * out. All row-major and contiguous. The mogrifier's products
// are a few MFLOP each: called on raw pointers they skip the tensor views and dispatch of at::mm, 20-25% of a round's
// time (Zen 4, 1 thread). b is never read transposed: MKL took 41 us for (32 x 512)(512 x 40) with b stored (40, 512)
// against 21 us with it stored (512, 40) (Xeon 6/167, 1 thread).
template <typename T>
void small_product(int64_t rows, int64_t n, int64_t k, const T* a, const T* b, T beta, T* out) {
  if (const GemmFn<T> gemm = exported_gemm<T>()) {  // column-major BLAS: out^T = b^T a^T
    const int m_ = static_cast<int>(n), n_ = static_cast<int>(rows), k_ = static_cast<int>(k);
    const T one = 1;
    gemm("N", "N", &m_, &n_, &k_, &one, b, &m_, a, &k_, &beta, out, &m_);
    return;
  }
  const auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  const at::Tensor left = at::from_blob(const_cast<T*>(a), {rows, k}, options);
  const at::Tensor right = at::from_blob(const_cast<T*>(b), {k, n}, options);
  at::Tensor result = at::from_blob(out, {rows, n}, options);
  if (beta == 0) {
    at::mm_out(result, left, right);
  } else {
    result.addmm_(left, right, 1, beta);
  }
}

class MogrifierWindow {
 public:
  MogrifierWindow(Tensors values, Tensors gates, at::Tensor z, Tensors lefts, Tensors rights, Tensors biases,
                  Tensors d_pre, at::Tensor d_z)
      : values_(std::move(values)), gates_(std::move(gates)), z_(std::move(z)), lefts_(std::move(lefts)),
        rights_(std::move(rights)), biases_(std::move(biases)), d_pre_(std::move(d_pre)), d_z_(std::move(d_z)) {
    for (auto* weights : {&lefts_, &rights_, &biases_}) {
      for (at::Tensor& weight : *weights) weight = weight.contiguous();
    }
    for (size_t r = 0; r < lefts_.size(); ++r) {  // the forward products' right operands
      lefts_t_.push_back(lefts_[r].t().contiguous());
      rights_t_.push_back(rights_[r].t().contiguous());
    }
  }

  int64_t input_size() const { return values_[0].size(2); }

  // Writes block 1 (h times the mask) and every round's z, gate and result at `step`, the batch's rows split among
  // the threads (the Python loop's call).
  void forward(int64_t step, const at::Tensor& h_in, const c10::optional<at::Tensor>& mask) {
    const at::Tensor h = h_in.contiguous();
    for_batch_slices(h.size(0), [&](const RowRange& rows) { forward_rows(step, rows.of(h), rows.of(mask), rows); });
  }

  // The same for the batch rows `rows` alone, given their h (contiguous) and mask (theirs, or one row for all).
  void forward_rows(int64_t step, const at::Tensor& h, const c10::optional<at::Tensor>& mask, const RowRange& rows) {
    const int64_t rounds = static_cast<int64_t>(lefts_.size()), rank = z_.size(3), count = rows.count;
    const at::Tensor keep = mask.has_value() ? mask->expand_as(h).contiguous() : h;  // h: unread
    AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "mogrify_forward", [&] {
      using T = scalar_t;
      Rows<T> at_rows{step, batch(), rows.first};
      T* __restrict__ h_seen = at_rows(values_[1]);
      const T *__restrict__ h_rows = h.data_ptr<T>(), *__restrict__ kept = keep.data_ptr<T>();
      for (int64_t i = 0; i < h.numel(); ++i) h_seen[i] = mask.has_value() ? h_rows[i] * kept[i] : h_rows[i];
      for (int64_t r = 0; r < rounds; ++r) {
        const int64_t source = values_[r + 1].size(2), target = values_[r].size(2);
        T* z = at_rows(z_[r]);
        small_product<T>(count, rank, source, at_rows(values_[r + 1]), lefts_t_[r].data_ptr<T>(), 0, z);
        T* gate = at_rows(gates_[r]);
        const T* bias = biases_[r].data_ptr<T>();
        for (int64_t row = 0; row < count; ++row) std::copy(bias, bias + target, gate + row * target);
        small_product<T>(count, target, rank, z, rights_t_[r].data_ptr<T>(), 1, gate);
        at::Tensor gate_rows = rows.at(gates_[r], step);
        at::sigmoid_out(gate_rows, gate_rows);
        gate_and_apply(gate, at_rows(values_[r]), at_rows(values_[r + 2]), count * target);
      }
    });
  }

  // Rounds in reverse: turns the gradients of the mogrified (x, h), contiguous and updated in place, into those
  // of the step's x and state-masked h, and writes every round's d_pre and d_z at `step`; the batch's rows split
  // among the threads (the Python loop's call).
  void backward(int64_t step, at::Tensor& d_x, at::Tensor& d_h) {
    TORCH_CHECK(d_x.is_contiguous() && d_h.is_contiguous(), "mogrifier gradients must be contiguous");
    for_batch_slices(d_x.size(0), [&](const RowRange& rows) { backward_rows(step, rows.of(d_x), rows.of(d_h), rows); });
  }

  // The same for the batch rows `rows` alone, given their gradients (contiguous).
  void backward_rows(int64_t step, const at::Tensor& d_x, const at::Tensor& d_h, const RowRange& rows) {
    const int64_t rounds = static_cast<int64_t>(lefts_.size()), rank = d_z_.size(3), count = rows.count;
    AT_DISPATCH_FLOATING_TYPES(d_x.scalar_type(), "mogrify_backward", [&] {
      using T = scalar_t;
      Rows<T> at_rows{step, batch(), rows.first};
      T *dx = d_x.data_ptr<T>(), *dh = d_h.data_ptr<T>();
      for (int64_t r = rounds - 1; r >= 0; --r) {
        T* d_target = r % 2 == 0 ? dx : dh;
        T* d_source = r % 2 == 0 ? dh : dx;
        const int64_t source = values_[r + 1].size(2), target = values_[r].size(2);
        T* d_pre = at_rows(d_pre_[r]);
        through_gate(at_rows(gates_[r]), at_rows(values_[r]), d_target, d_pre, count * target);
        T* d_z = at_rows(d_z_[r]);
        small_product<T>(count, rank, target, d_pre, rights_[r].data_ptr<T>(), 0, d_z);
        small_product<T>(count, source, rank, d_z, lefts_[r].data_ptr<T>(), 1, d_source);
      }
    });
  }

 private:
  // The first of a thread's rows at one step of a (T, B, D) block, or of one round's (T, B, K) part of z.
  template <typename T>
  struct Rows {
    int64_t step, batch, first;
    T* operator()(const at::Tensor& block) const {
      return block.data_ptr<T>() + (step * batch + first) * block.size(-1);
    }
  };

  int64_t batch() const { return values_[0].size(1); }

  Tensors values_, gates_;
  at::Tensor z_;
  Tensors lefts_, rights_, biases_, lefts_t_, rights_t_, d_pre_;
  at::Tensor d_z_;
};

// A mogrifier LSTM's window (models/lstm_window.py): per step, the mogrifier's rounds (`mogrifier`, which keeps
// the mogrified x and h of every step in its blocks `x_values` and `h_values`), the two products and the update.
// Returns the outputs, c before each step and after the last, and the update's caches.
std::vector<at::Tensor> mogrifier_lstm_window_forward(MogrifierWindow& mogrifier, const at::Tensor& x_values,
                                                      const at::Tensor& h_values, const at::Tensor& h0,
                                                      const at::Tensor& c0, const at::Tensor& input_weight,
                                                      const at::Tensor& input_bias, const at::Tensor& weight,
                                                      bool onednn, const c10::optional<at::Tensor>& mask,
                                                      bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = x_values.size(0);
  UpdateRecord record(steps, c0);
  forward_through_time(steps, h0, mask, [&](int64_t t, const RowRange& rows, const at::Tensor& h,
                                            const c10::optional<at::Tensor>& keep) {
    mogrifier.forward_rows(t, h, keep, rows);
    const at::Tensor x_term = recurrent_product(rows.at(x_values, t), input_weight, onednn, input_bias);
    const at::Tensor h_term = recurrent_product(rows.at(h_values, t), weight, onednn);
    return record.add(t, rows, x_term, h_term, cap_input_gate);
  });
  return record.results();
}

// Its backward through time: the gate pre-activation gradients of every step (T, B, 4H), those of the inputs
// (T, B, E), h0 and c0. The weights are transposed and packed for oneDNN, else the plain ones for at::mm.
std::vector<at::Tensor> mogrifier_lstm_window_backward(MogrifierWindow& mogrifier, const at::Tensor& d_outputs,
                                                       const at::Tensor& dh_last, const at::Tensor& dc_last,
                                                       const at::Tensor& cells, const at::Tensor& sigmoids,
                                                       const at::Tensor& j, const at::Tensor& i_used,
                                                       const at::Tensor& tanh_c, const at::Tensor& input_weight_t,
                                                       const at::Tensor& weight_t, bool onednn,
                                                       const c10::optional<at::Tensor>& mask, bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = d_outputs.size(0), batch = dh_last.size(0);
  const at::Tensor d_gates = at::empty({steps, batch, 4 * dh_last.size(1)}, dh_last.options());
  const at::Tensor d_inputs = at::empty({steps, batch, mogrifier.input_size()}, dh_last.options());
  Tensors first = backward_through_time(steps, dh_last, dc_last, mask, [&](int64_t t, const RowRange& rows,
                                                                            at::Tensor& dh, at::Tensor& dc) {
    const at::Tensor d_gates_t = rows.at(d_gates, t);
    dc = lstm_update_backward_into(rows.at(sigmoids, t), rows.at(j, t), rows.at(i_used, t), rows.at(cells, t),
                                   rows.at(tanh_c, t), dh + rows.at(d_outputs, t), dc, cap_input_gate, d_gates_t);
    const at::Tensor dx = gradient_product(d_gates_t, input_weight_t, onednn).contiguous();
    dh = gradient_product(d_gates_t, weight_t, onednn).contiguous();
    mogrifier.backward_rows(t, dx, dh, rows);
    rows.at(d_inputs, t).copy_(dx);
  });
  return {d_gates, d_inputs, first[0], first[1]};
}


// The RLSTM's step (models.cells.RLSTMCell.step) from its input side x_term (B, 2H: i, j) and the h its products
// read (state-masked, or mogrified). `weights` are the recurrent (3H: i, j, f), forget and output weights for
// recurrent_product, `biases` the forget and output gates'. Returns h, c, what the forget and output weights read
// (i * j, and c times the state mask) and `saved` (B, 6H): i, j, f, the input gate used (min(i, 1 - f) with the
// cap), o and tanh(c), what the backward pass reads. tanh(x) is 2 sigma(2x) - 1, as in Python. Writes them to
// `out`'s contiguous tensors; without a mask, out.c_seen is out.c.
struct RLSTMOutputs {
  at::Tensor h, c, u, c_seen, saved;
};

void rlstm_step(const at::Tensor& x_term_in, const at::Tensor& h_seen, const at::Tensor& c_prev,
                const Tensors& weights, const Tensors& biases, bool onednn, const c10::optional<at::Tensor>& mask,
                bool cap_input_gate, const RLSTMOutputs& out) {
  const at::Tensor x_term = with_contiguous_columns(x_term_in);
  const at::Tensor from_h = recurrent_product(h_seen, weights[0], onednn).contiguous();
  const int64_t batch = c_prev.size(0), hidden = c_prev.size(1), width = 6 * hidden;
  const at::Tensor &saved = out.saved, &u = out.u, &h = out.h, &c = out.c, &c_seen = out.c_seen;
  const at::Tensor m = mask.has_value() ? mask->expand_as(c_prev).contiguous() : c_prev;  // c_prev: unread
  auto sigmoid_columns = [&](int64_t first, int64_t rows, int64_t column, int64_t columns) {
    at::Tensor slice = saved.narrow(0, first, rows).narrow(1, column, columns);
    at::sigmoid_out(slice, slice);
  };
  AT_DISPATCH_FLOATING_TYPES(c_prev.scalar_type(), "rlstm_step", [&] {
    using T = scalar_t;
    for_row_slices(batch, [&](int64_t first, int64_t rows) {  // i, j and i * j
      for (int64_t row = first; row < first + rows; ++row) {
        const T* __restrict__ x = x_term.data_ptr<T>() + row * x_term.stride(0);
        const T* __restrict__ y = from_h.data_ptr<T>() + row * 3 * hidden;
        T* __restrict__ s = saved.data_ptr<T>() + row * width;
        for (int64_t k = 0; k < hidden; ++k) s[k] = x[k] + y[k];
        for (int64_t k = hidden; k < 2 * hidden; ++k) s[k] = 2 * (x[k] + y[k]);
      }
      sigmoid_columns(first, rows, 0, 2 * hidden);
      for (int64_t row = first; row < first + rows; ++row) {
        T* __restrict__ s = saved.data_ptr<T>() + row * width;
        T* __restrict__ uu = u.data_ptr<T>() + row * hidden;
        for (int64_t k = 0; k < hidden; ++k) {
          s[hidden + k] = 2 * s[hidden + k] - 1;
          uu[k] = s[k] * s[hidden + k];
        }
      }
    });
    const at::Tensor f_term = with_contiguous_columns(recurrent_product(u, weights[1], onednn, biases[0]));
    for_row_slices(batch, [&](int64_t first, int64_t rows) {  // f, c and c as the output gate sees it
      for (int64_t row = first; row < first + rows; ++row) {
        const T* __restrict__ y = from_h.data_ptr<T>() + row * 3 * hidden + 2 * hidden;
        const T* __restrict__ z = f_term.data_ptr<T>() + row * f_term.stride(0);
        T* __restrict__ s = saved.data_ptr<T>() + row * width;
        for (int64_t k = 0; k < hidden; ++k) s[2 * hidden + k] = z[k] + y[k];
      }
      sigmoid_columns(first, rows, 2 * hidden, hidden);
      for (int64_t row = first; row < first + rows; ++row) {
        const int64_t at_row = row * hidden;
        T* __restrict__ s = saved.data_ptr<T>() + row * width;
        const T *__restrict__ cp = c_prev.data_ptr<T>() + at_row, *__restrict__ keep = m.data_ptr<T>() + at_row;
        T *__restrict__ cc = c.data_ptr<T>() + at_row, *__restrict__ seen = c_seen.data_ptr<T>() + at_row;
        for (int64_t k = 0; k < hidden; ++k) {
          const T i = s[k], j = s[hidden + k], f = s[2 * hidden + k];
          const T used = cap_input_gate ? std::min(i, 1 - f) : i;
          const T cell = f * cp[k] + used * j;
          s[3 * hidden + k] = used;
          s[5 * hidden + k] = 2 * cell;
          cc[k] = cell;
          if (mask.has_value()) seen[k] = cell * keep[k];
        }
      }
    });
    const at::Tensor o_term = with_contiguous_columns(recurrent_product(c_seen, weights[2], onednn, biases[1]));
    for_row_slices(batch, [&](int64_t first, int64_t rows) {  // o, tanh(c) and h
      for (int64_t row = first; row < first + rows; ++row) {
        const T* __restrict__ z = o_term.data_ptr<T>() + row * o_term.stride(0);
        T* __restrict__ s = saved.data_ptr<T>() + row * width;
        for (int64_t k = 0; k < hidden; ++k) s[4 * hidden + k] = z[k];
      }
      sigmoid_columns(first, rows, 4 * hidden, 2 * hidden);
      for (int64_t row = first; row < first + rows; ++row) {
        T* __restrict__ s = saved.data_ptr<T>() + row * width;
        T* __restrict__ hh = h.data_ptr<T>() + row * hidden;
        for (int64_t k = 0; k < hidden; ++k) {
          const T t = 2 * s[5 * hidden + k] - 1;
          s[5 * hidden + k] = t;
          hh[k] = s[4 * hidden + k] * t;
        }
      }
    });
  });
}

// Its gradient (models.cells.RLSTMCell.step_backward), given those of h and c: those of the pre-activations of
// i, j and f (B, 3H), of the output gate's, of the h the products read and of c_prev. `weights_t` are the three
// weights transposed and packed for oneDNN, else the plain ones for at::mm.
std::vector<at::Tensor> rlstm_step_backward(const at::Tensor& saved, const at::Tensor& c_prev, const at::Tensor& dh,
                                            const at::Tensor& dc, const Tensors& weights_t, bool onednn,
                                            const c10::optional<at::Tensor>& mask, bool cap_input_gate) {
  auto product = [&](const at::Tensor& grads, const at::Tensor& w) {
    return gradient_product(grads, w, onednn).contiguous();
  };
  const int64_t batch = dh.size(0), hidden = dh.size(1), width = 6 * hidden;
  at::Tensor d_o = at::empty_like(dh), d_c = at::empty_like(dh), d_f = at::empty_like(dh);
  at::Tensor d_pre = at::empty({batch, 3 * hidden}, dh.options()), dc_prev = at::empty_like(dh);
  const at::Tensor m = mask.has_value() ? mask->expand_as(dh).contiguous() : dh;  // dh: unread
  AT_DISPATCH_FLOATING_TYPES(dh.scalar_type(), "rlstm_step_backward", [&] {
    using T = scalar_t;
    for_row_slices(batch, [&](int64_t first, int64_t rows) {  // through h = o tanh(c)
      for (int64_t row = first; row < first + rows; ++row) {
        const int64_t at_row = row * hidden;
        const T* __restrict__ s = saved.data_ptr<T>() + row * width;
        const T *__restrict__ gh = dh.data_ptr<T>() + at_row, *__restrict__ gc = dc.data_ptr<T>() + at_row;
        T *__restrict__ go = d_o.data_ptr<T>() + at_row, *__restrict__ gcc = d_c.data_ptr<T>() + at_row;
        for (int64_t k = 0; k < hidden; ++k) {
          const T o = s[4 * hidden + k], t = s[5 * hidden + k];
          go[k] = gh[k] * t * o * (1 - o);
          gcc[k] = gc[k] + gh[k] * o * (1 - t * t);
        }
      }
    });
    const at::Tensor d_c_seen = product(d_o, weights_t[2]);
    for_row_slices(batch, [&](int64_t first, int64_t rows) {  // through c = f c_prev + i_used j
      for (int64_t row = first; row < first + rows; ++row) {
        const int64_t at_row = row * hidden;
        const T* __restrict__ s = saved.data_ptr<T>() + row * width;
        const T *__restrict__ cp = c_prev.data_ptr<T>() + at_row, *__restrict__ keep = m.data_ptr<T>() + at_row;
        const T* __restrict__ seen = d_c_seen.data_ptr<T>() + at_row;
        T *__restrict__ gcc = d_c.data_ptr<T>() + at_row, *__restrict__ gf = d_f.data_ptr<T>() + at_row;
        T *__restrict__ dp = d_pre.data_ptr<T>() + row * 3 * hidden, *__restrict__ dcp = dc_prev.data_ptr<T>() + at_row;
        for (int64_t k = 0; k < hidden; ++k) {
          const T i = s[k], j = s[hidden + k], f = s[2 * hidden + k], used = s[3 * hidden + k];
          const T d_cell = gcc[k] + (mask.has_value() ? seen[k] * keep[k] : seen[k]);
          T d_i = d_cell * j, d_f_gate = d_cell * cp[k];
          if (cap_input_gate && used < i) {  // min(i, 1 - f) took 1 - f: its gradient goes to f, negated
            d_f_gate -= d_i;
            d_i = 0;
          }
          dp[k] = d_i;  // completed below, once the forget gate's input (i * j) has its gradient
          dp[hidden + k] = d_cell * used;
          gf[k] = d_f_gate * f * (1 - f);
          dcp[k] = d_cell * f;
        }
      }
    });
    const at::Tensor d_u = product(d_f, weights_t[1]);
    for_row_slices(batch, [&](int64_t first, int64_t rows) {  // through i * j
      for (int64_t row = first; row < first + rows; ++row) {
        const int64_t at_row = row * hidden;
        const T* __restrict__ s = saved.data_ptr<T>() + row * width;
        const T *__restrict__ gu = d_u.data_ptr<T>() + at_row, *__restrict__ gf = d_f.data_ptr<T>() + at_row;
        T* __restrict__ dp = d_pre.data_ptr<T>() + row * 3 * hidden;
        for (int64_t k = 0; k < hidden; ++k) {
          const T i = s[k], j = s[hidden + k];
          dp[k] = (dp[k] + gu[k] * j) * i * (1 - i);
          dp[hidden + k] = (dp[hidden + k] + gu[k] * i) * (1 - j * j);
          dp[2 * hidden + k] = gf[k];
        }
      }
    });
  });
  return {d_pre, d_o, product(d_pre, weights_t[0]), dc_prev};
}

// What the RLSTM's window loops keep of every step, written in place: its output h, c before each step and after
// the last (c0 first), what the forget and output weights read (without a mask, the output gate reads c), and the
// backward pass's `saved`, each over the whole window.
struct RLSTMRecord {
  at::Tensor outputs, cells, forget_inputs, output_inputs, saved;

  RLSTMRecord(int64_t steps, const at::Tensor& c0, bool masked)
      : outputs(at::empty({steps, c0.size(0), c0.size(1)}, c0.options())),
        cells(at::empty({steps + 1, c0.size(0), c0.size(1)}, c0.options())),
        forget_inputs(at::empty_like(outputs)),
        output_inputs(masked ? at::empty_like(outputs) : cells.narrow(0, 1, steps)),
        saved(at::empty({steps, c0.size(0), 6 * c0.size(1)}, c0.options())) {
    cells.select(0, 0).copy_(c0);
  }

  // Runs step t (rlstm_step) for the batch rows `rows`, given their mask, and returns their h.
  at::Tensor add(int64_t t, const RowRange& rows, const at::Tensor& x_term, const at::Tensor& h_seen,
                 const Tensors& weights, const Tensors& biases, bool onednn, const c10::optional<at::Tensor>& mask,
                 bool cap_input_gate) {
    rlstm_step(x_term, h_seen, rows.at(cells, t), weights, biases, onednn, mask, cap_input_gate,
               {rows.at(outputs, t), rows.at(cells, t + 1), rows.at(forget_inputs, t), rows.at(output_inputs, t),
                rows.at(saved, t)});
    return rows.at(outputs, t);
  }

  Tensors results() const { return {outputs, cells, forget_inputs, output_inputs, saved}; }
};

// The RLSTM over a whole window (models/rlstm_window.py): x_part (T, B, 2H) holds the input side of every step
// (one matrix multiply over the window, made by the caller). Returns the outputs, c before each step and after the
// last, what the forget and output weights read, `saved` (rlstm_step), and the masked h each step's product read.
Tensors rlstm_window_forward(const at::Tensor& x_part, const at::Tensor& h0, const at::Tensor& c0,
                             const Tensors& weights, const Tensors& biases, bool onednn,
                             const c10::optional<at::Tensor>& mask, bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = x_part.size(0);
  RLSTMRecord record(steps, c0, mask.has_value());
  const at::Tensor h_seen = at::empty_like(record.outputs);
  forward_through_time(steps, h0, mask, [&](int64_t t, const RowRange& rows, const at::Tensor& h,
                                            const c10::optional<at::Tensor>& keep) {
    masked_into(rows.at(h_seen, t), h, keep);
    return record.add(t, rows, rows.at(x_part, t), rows.at(h_seen, t), weights, biases, onednn, keep, cap_input_gate);
  });
  Tensors results = record.results();
  results.push_back(h_seen);
  return results;
}

// What the RLSTM's backward loops keep of every step: the gradients of the pre-activations of i, j and f
// (T, B, 3H) and of the output gate's (T, B, H).
struct RLSTMGradients {
  at::Tensor d_pre, d_o;

  RLSTMGradients(int64_t steps, const at::Tensor& dh_last)
      : d_pre(at::empty({steps, dh_last.size(0), 3 * dh_last.size(1)}, dh_last.options())),
        d_o(at::empty({steps, dh_last.size(0), dh_last.size(1)}, dh_last.options())) {}

  // Step t backward (rlstm_step_backward) for the batch rows `rows`: turns dh (its output's gradient not yet added)
  // and dc into those of the h its products read and of c before it; returns the step's d_pre.
  at::Tensor step(int64_t t, const RowRange& rows, const at::Tensor& saved, const at::Tensor& cells,
                  const at::Tensor& d_outputs, const Tensors& weights_t, bool onednn,
                  const c10::optional<at::Tensor>& mask, bool cap_input_gate, at::Tensor& dh, at::Tensor& dc) {
    Tensors step = rlstm_step_backward(rows.at(saved, t), rows.at(cells, t), dh + rows.at(d_outputs, t), dc,
                                       weights_t, onednn, rows.of(mask), cap_input_gate);
    rows.at(d_pre, t).copy_(step[0]);
    rows.at(d_o, t).copy_(step[1]);
    dh = step[2];
    dc = step[3];
    return step[0];
  }
};

// Its backward through time: the gradients of the pre-activations of i, j and f (T, B, 3H), of the output gate's
// (T, B, H), of h0 and of c0.
Tensors rlstm_window_backward(const at::Tensor& d_outputs, const at::Tensor& dh_last, const at::Tensor& dc_last,
                              const at::Tensor& cells, const at::Tensor& saved, const Tensors& weights_t,
                              bool onednn, const c10::optional<at::Tensor>& mask, bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = d_outputs.size(0);
  RLSTMGradients grads(steps, dh_last);
  Tensors first = backward_through_time(steps, dh_last, dc_last, mask, [&](int64_t t, const RowRange& rows,
                                                                            at::Tensor& dh, at::Tensor& dc) {
    grads.step(t, rows, saved, cells, d_outputs, weights_t, onednn, mask, cap_input_gate, dh, dc);
  });
  return {grads.d_pre, grads.d_o, first[0], first[1]};
}

// A mogrifier RLSTM's window: per step, the mogrifier's rounds (`mogrifier`, which keeps the mogrified x and h of
// every step in its blocks `x_values` and `h_values`), the input side's product and the step. Returns what
// rlstm_window_forward does but the masked h (the mogrifier's block 1).
Tensors mogrifier_rlstm_window_forward(MogrifierWindow& mogrifier, const at::Tensor& x_values,
                                       const at::Tensor& h_values, const at::Tensor& h0, const at::Tensor& c0,
                                       const at::Tensor& input_weight, const at::Tensor& input_bias,
                                       const Tensors& weights, const Tensors& biases, bool onednn,
                                       const c10::optional<at::Tensor>& mask, bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = x_values.size(0);
  RLSTMRecord record(steps, c0, mask.has_value());
  forward_through_time(steps, h0, mask, [&](int64_t t, const RowRange& rows, const at::Tensor& h,
                                            const c10::optional<at::Tensor>& keep) {
    mogrifier.forward_rows(t, h, keep, rows);
    const at::Tensor x_term = recurrent_product(rows.at(x_values, t), input_weight, onednn, input_bias);
    return record.add(t, rows, x_term, rows.at(h_values, t), weights, biases, onednn, keep, cap_input_gate);
  });
  return record.results();
}

// Its backward through time: what rlstm_window_backward returns, with the gradients of the inputs (T, B, E)
// before those of h0 and c0.
Tensors mogrifier_rlstm_window_backward(MogrifierWindow& mogrifier, const at::Tensor& d_outputs,
                                        const at::Tensor& dh_last, const at::Tensor& dc_last, const at::Tensor& cells,
                                        const at::Tensor& saved, const at::Tensor& input_weight_t,
                                        const Tensors& weights_t, bool onednn, const c10::optional<at::Tensor>& mask,
                                        bool cap_input_gate) {
  at::NoGradGuard no_grad;
  const int64_t steps = d_outputs.size(0), hidden = dh_last.size(1);
  RLSTMGradients grads(steps, dh_last);
  const at::Tensor d_inputs = at::empty({steps, dh_last.size(0), mogrifier.input_size()}, dh_last.options());
  Tensors first = backward_through_time(steps, dh_last, dc_last, mask, [&](int64_t t, const RowRange& rows,
                                                                            at::Tensor& dh, at::Tensor& dc) {
    const at::Tensor d_pre = grads.step(t, rows, saved, cells, d_outputs, weights_t, onednn, mask, cap_input_gate,
                                        dh, dc);
    const at::Tensor d_x_part = d_pre.narrow(1, 0, 2 * hidden).contiguous();
    const at::Tensor dx = gradient_product(d_x_part, input_weight_t, onednn).contiguous();
    dh = dh.contiguous();
    mogrifier.backward_rows(t, dx, dh, rows);
    rows.at(d_inputs, t).copy_(dx);
  });
  return {grads.d_pre, grads.d_o, d_inputs, first[0], first[1]};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  pybind11::class_<MogrifierWindow>(module, "MogrifierWindow")
      .def(pybind11::init<Tensors, Tensors, at::Tensor, Tensors, Tensors, Tensors, Tensors, at::Tensor>())
      .def("forward", &MogrifierWindow::forward)
      .def("backward", &MogrifierWindow::backward);
  module.def("lstm_update", &lstm_update);
  module.def("lstm_update_backward", &lstm_update_backward);
  module.def("lstm_window_forward", &lstm_window_forward);
  module.def("lstm_window_backward", &lstm_window_backward);
  module.def("mogrifier_lstm_window_forward", &mogrifier_lstm_window_forward);
  module.def("mlstm_window_forward", &mlstm_window_forward);
  module.def("mlstm_window_backward", &mlstm_window_backward);
  module.def("mogrifier_lstm_window_backward", &mogrifier_lstm_window_backward);
  module.def("rlstm_window_forward", &rlstm_window_forward);
  module.def("rlstm_window_backward", &rlstm_window_backward);
  module.def("mogrifier_rlstm_window_forward", &mogrifier_rlstm_window_forward);
  module.def("mogrifier_rlstm_window_backward", &mogrifier_rlstm_window_backward);
}
