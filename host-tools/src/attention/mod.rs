//! Decode attention over a paged KV cache: the cache and its metadata, the
//! f64 reference, the host planner (FlashInfer-style split-KV), the
//! `decode` workloads and, in [`sparse`], the `sparse-decode` workload
//! (dense or indexer + top-k + sparse attention per request, the tier
//! chosen on the device).
//!
//! One decode step: each of `B` requests has one query token with
//! `q_heads` query heads and a KV cache of `len[b]` tokens with `kv_heads`
//! KV heads (GQA: the `G = q_heads / kv_heads` query heads `h*G .. (h+1)*G`
//! share KV head `h`). Output: `softmax(scale * q K^T) V` per (request,
//! query head), `scale = 1/sqrt(D)`.
//!
//! # Layout (tensor order and shapes of every decode table)
//!
//! | # | tensor  | dtype | shape                          | contents |
//! |---|---------|-------|--------------------------------|----------|
//! | 0 | `q`     | f32   | `[B * q_heads, D]`             | row `b*q_heads + j`: query head `j` of request `b` |
//! | 1 | `kv`    | f32   | `[kv_heads * pages * 2P, D]`   | KV head `h`'s pool is rows `h*pages*2P ..`; in it page `p` holds keys at rows `p*2P .. p*2P+P`, values at `p*2P+P .. (p+1)*2P` |
//! | 2 | `meta`  | i32   | `[2B, W]`                      | row `2b`: request `b`'s page table (`W` entries, unused ones -1); row `2b+1`: selected positions (sparse kernels; -1 here) |
//! | 3 | `out`   | f32   | `[B * q_heads, D + 2]`         | the final state per query row: `o[0..D]`, `m`, `l` (base 2) |
//! | 4 | `parts` | f32   | `[max(1, split rows), D + 2]`  | partial states of split requests (scratch) |
//!
//! Token `t` of request `b` lives on page `meta[2b][t / P]`, row `t % P`
//! of that page, in every KV head's pool (the same page numbers for all
//! heads). Pages are handed to requests in shuffled order, so a kernel
//! that ignores the page table reads the wrong keys.
//!
//! # Work
//!
//! A work item is (request, KV head, chunk of tokens): one
//! `attn_decode_partial` task on the `G` query rows of that KV head. A
//! (request, KV head) with one chunk writes its state straight into `out`;
//! one with `n > 1` chunks writes `n` consecutive `G`-row states into
//! `parts` and one `attn_merge` task merges them into `out` as a state
//! (`o`, `m`, `l`; the check reads `o`). The runtime orders each merge
//! after its partials from the regions alone (read after write of
//! `parts`). See [`plan`] for how the chunk size is chosen.
//!
//! Building blocks, for reuse (e.g. by an on-device planner):
//! [`kv::DecodeData::build`] (cache and metadata), [`kv::check_meta`]
//! (metadata validation), [`reference::attention`] and
//! [`reference::bound`] (the f64 reference and its error bound),
//! [`plan::choose_chunk`] and [`plan::Plan`] (the chunking), and
//! [`workload::decode_table`] (the table of a plan).

pub mod device;
pub mod figures;
pub mod kv;
pub mod plan;
pub mod reference;
pub mod sparse;
pub mod workload;

pub use kv::{check_meta, DecodeData, DecodeShape, MetaError};
pub use plan::{choose_chunk, CostModel, Plan, Strategy};
