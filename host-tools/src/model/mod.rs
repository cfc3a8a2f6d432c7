//! Model workloads: a transformer decode layer as one program, two layers
//! back to back, and stitched batches.
//!
//! One decode step of a batch of `B` requests, each with one new token and
//! a paged KV cache of its own length, through `L` layers:
//!
//! ```text
//! decode_plan(lens -> plan); c = load plan[0]        (once: every layer has the same lengths)
//! for each layer l (unrolled when the program is built):
//!     xn  = rmsnorm(x[l], g1)                         (row blocks of 16)
//!     qkv = xn Wqkv                                   (64x64 GEMM tiles, K accumulated in place)
//!     parallel b in 0..B:                             (pos = lens[b] - 1, read on the device)
//!         q[b]          = rope(qkv[b, q heads], cs[pos])
//!         parallel h in 0..kv_heads:                  (the page and row come from meta, on the device)
//!             kv[h, page(pos), pos % P]      = rope(qkv[b, k head h], cs[pos])
//!             kv[h, page(pos), P + pos % P]  = copy(qkv[b, v head h])
//!     state = decode attention over lens, chunks of c (attention::device::attention_calls)
//!     o[b]  = copy(state[b, :, 0..D])                 (the heads' o as one row)
//!     h     = copy(x[l]);  h += o Wo                  (the residual is the accumulator's start)
//!     hn    = rmsnorm(h, g2)
//!     dense:  x[l+1] = copy(h);  x[l+1] += (silu(hn Wg) * (hn Wu)) Wd
//! ```
//!
//! The runtime orders everything from the regions alone: the attention of
//! KV head `h` reads the whole pool of `h`, so it waits for every append
//! to that pool; a layer's first norm waits for the tiles of the previous
//! layer's output it reads. Layers are unrolled (each has its own
//! weights, cache and intermediates), so the program grows with `L`.
//!
//! The f64 reference ([`mod@reference`]) carries a bound on each value's
//! error through every step, derived from the f32 kernels' rounding.

pub mod layer;
pub mod reference;
pub mod stitch;

pub use layer::{decode_layer_workload, LayerData, LayerShape, Mlp, MOE};
