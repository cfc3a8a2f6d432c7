//! The decode tables and the `decode`, `decode-uniform` and `decode-skew`
//! workloads.

use wsp_ffi::ArgAccess::{In, Out};
pub(crate) use wsp_ffi::{
    WspKernelId_WSP_KERNEL_ATTN_DECODE_PARTIAL as PARTIAL,
    WspKernelId_WSP_KERNEL_ATTN_MERGE as MERGE,
};

use super::kv::{DecodeData, DecodeShape};
use super::plan::{Plan, Strategy};
use super::reference;
use super::sparse::failed;
use crate::table::{Arena, Arg, TableBuilder, TensorId};
use crate::workloads::{Params, Verification, Workload, WorkloadError};

/// Query heads of the named decode workloads.
pub const Q_HEADS: u32 = 32;
/// KV heads of the named decode workloads (GQA group of 4).
pub const KV_HEADS: u32 = 8;
/// `attn_merge`'s largest stack of partial states, in rows (`n * G`).
pub const MAX_PART_ROWS: u32 = 4096;

/// The tensors of a decode table, in declaration order (see [the module
/// layout](super)).
#[derive(Clone, Copy, Debug)]
pub struct DecodeTensors {
    /// `[B * q_heads, D]`.
    pub q: TensorId,
    /// `[kv_heads * pages * 2P, D]`.
    pub kv: TensorId,
    /// i32 `[2B, W]`.
    pub meta: TensorId,
    /// `[B * q_heads, D + 2]`: the final states.
    pub out: TensorId,
    /// `[max(1, plan.parts_rows), D + 2]`: partial states of split groups
    /// (a plan of more rows than `u32` holds is refused).
    pub parts: TensorId,
}

/// The table of `plan` over `data`: the five tensors, then the partial
/// items in the plan's order, then one merge per split (request, KV head).
/// The arena is filled with `q`, `kv` and `meta`. A plan that is not one
/// of `data`'s shape ([`Plan::check`]) is refused.
pub fn decode_table(
    data: &DecodeData,
    plan: &Plan,
) -> Result<(TableBuilder, DecodeTensors, Arena), WorkloadError> {
    data.check()
        .map_err(|e| WorkloadError::Params(e.to_string()))?;
    plan.check(&data.shape).map_err(WorkloadError::Params)?;
    let s = &data.shape;
    let (b, d, g, page) = (s.batch(), s.d, s.group(), s.page);
    // chunks x G in u64: a plan of chunks of 1 token may have 2^32 - 1.
    if let Some(big) = plan
        .groups
        .iter()
        .find(|gr| gr.chunks as u64 * g as u64 > MAX_PART_ROWS as u64)
    {
        return Err(WorkloadError::Params(format!(
            "request {}: {} chunks of {} rows exceed attn_merge's {MAX_PART_ROWS} rows",
            big.request, big.chunks, g
        )));
    }
    let parts_rows = u32::try_from(plan.parts_rows.max(1)).map_err(|_| {
        WorkloadError::Params(format!(
            "{} rows of partial states exceed the table's 32-bit sizes",
            plan.parts_rows
        ))
    })?;
    // The checks bound every product below: the shape's B x q_heads
    // (so B x kv_heads, request x q_heads + head x G) and 2B, the data's
    // kv_heads x pool rows, each group's chunks x G (above) and each
    // row of partial states, below `parts_rows`.
    let mut t = TableBuilder::new();
    let ids = DecodeTensors {
        q: t.tensor("q", &[b * s.q_heads, d])?,
        kv: t.tensor("kv", &[s.kv_heads * data.pool_rows(), d])?,
        meta: t.tensor_i32("meta", &[2 * b, data.width])?,
        out: t.tensor("out", &[b * s.q_heads, d + 2])?,
        parts: t.tensor("parts", &[parts_rows, d + 2])?,
    };
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let group = |r: u32, h: u32| &plan.groups[(r * s.kv_heads + h) as usize];
    for it in &plan.items {
        let row = it.request * s.q_heads + it.kv_head * g;
        let gr = group(it.request, it.kv_head);
        let part = match gr.parts_row {
            Some(first) => Arg::tile(ids.parts, Out, (first as u32) + it.chunk * g, 0, g, d + 2),
            None => Arg::tile(ids.out, Out, row, 0, g, d + 2),
        };
        let args = [
            Arg::tile(ids.q, In, row, 0, g, d),
            Arg::tile(
                ids.kv,
                In,
                it.kv_head * data.pool_rows(),
                0,
                data.pool_rows(),
                d,
            ),
            Arg::tile(ids.meta, In, 2 * it.request, 0, 1, data.width),
            part,
        ];
        let scalars = [
            it.first as u64,
            it.count as u64,
            page as u64,
            scale.to_bits() as u64,
        ];
        t.task(PARTIAL, &args, &scalars)?;
    }
    for gr in &plan.groups {
        let Some(first) = gr.parts_row else { continue };
        let first = first as u32; // below `parts_rows`, a u32
        let row = gr.request * s.q_heads + gr.kv_head * g;
        let args = [
            Arg::tile(ids.parts, In, first, 0, gr.chunks * g, d + 2),
            Arg::tile(ids.out, Out, row, 0, g, d + 2),
        ];
        t.task(MERGE, &args, &[gr.chunks as u64])?;
    }
    let mut arena = Arena::zeroed(t.arena_size());
    arena.write_f32(t.layout(ids.q), &data.q);
    arena.write_f32(t.layout(ids.kv), &data.kv);
    arena.write_i32(t.layout(ids.meta), &data.meta);
    Ok((t, ids, arena))
}

/// A decode workload: `plan` over `data`, checked against the f64
/// reference with [`reference::bound`]. The reference is computed when the
/// check runs, from `reference_data()` (e.g. the data rebuilt from its
/// seed: an oracle independent of the arena the run wrote).
pub fn decode_workload_with(
    name: &'static str,
    data: &DecodeData,
    plan: &Plan,
    reference_data: impl Fn() -> DecodeData + 'static,
) -> Result<Workload, WorkloadError> {
    let (t, ids, arena) = decode_table(data, plan)?;
    let s = data.shape.clone();
    let (g, kvh, qh) = (s.group(), s.kv_heads, s.q_heads);
    let chunks: Vec<u32> = plan.groups.iter().map(|gr| gr.chunks).collect();
    let out = t.layout(ids.out).clone();
    let d = s.d as usize;
    let check = move |arena: &Arena| {
        let want = match reference::attention(&reference_data()) {
            Ok(r) => r,
            Err(e) => return failed(format!("the f64 reference: {e}"), reference::TOLERANCE),
        };
        // Made by the reference: its sizes are right.
        let bound = reference::bound_unchecked(&want, |row| {
            let (r, j) = (row as u32 / qh, row as u32 % qh);
            chunks[(r * kvh + j / g) as usize]
        });
        let got: Vec<f32> = arena
            .read_f32(&out)
            .chunks_exact(d + 2)
            .flat_map(|row| row[..d].to_vec())
            .collect();
        Verification::compare("out", &got, &want.o, |i| bound[i], reference::TOLERANCE)
    };
    let total: u64 = s.lengths.iter().map(|&l| l as u64).sum();
    let chunk = match plan.chunk {
        u32::MAX => "no split".to_string(),
        c => format!("chunks of {c}"),
    };
    Ok(Workload {
        name,
        summary: format!(
            "decode attention: {} requests, {total} KV tokens (longest {}), {qh} query / {kvh} KV heads, \
             D {}, pages of {}; {chunk}: {} partials, {} merges",
            s.batch(),
            s.lengths.iter().max().copied().unwrap_or(0),
            s.d,
            s.page,
            plan.items.len(),
            plan.merges()
        ),
        table: t.finish()?,
        arena,
        tensors: t.layouts().to_vec(),
        tasks: t.num_tasks(),
        check: Box::new(check),
        csp: Default::default(),
    })
}

/// [`decode_workload_with`] whose reference uses a copy of `data`.
pub fn decode_workload(
    name: &'static str,
    data: &DecodeData,
    plan: &Plan,
) -> Result<Workload, WorkloadError> {
    let copy = data.clone();
    decode_workload_with(name, data, plan, move || copy.clone())
}

/// `n` lengths spread geometrically over `1 ..= longest`, increasing.
fn spread(n: u32, longest: u32) -> Vec<u32> {
    (0..n)
        .map(|i| {
            let f = if n > 1 {
                i as f64 / (n - 1) as f64
            } else {
                1.0
            };
            ((longest as f64).powf(f).round() as u32).clamp(1, longest)
        })
        .collect()
}

/// The lengths of the named workload: `m` requests, longest `n` (every
/// workload has a request of `n` tokens, whatever `m`).
/// - `decode`: 1, 2, 3, 63, 64, 65, n-1 and n (those <= n), then lengths
///   spread geometrically over 1..=n, interleaved short and long; with
///   fewer requests than edge cases, the first `m - 1` and `n`;
/// - `decode-uniform`: all `n`;
/// - `decode-skew`: request `m / 2` has `n`, the others spread
///   geometrically over 1 ..= max(1, n / 32).
pub fn lengths_of(name: &str, m: u32, n: u32) -> Vec<u32> {
    match name {
        "decode" => {
            let mut v: Vec<u32> = [1, 2, 3, 63, 64, 65, n.saturating_sub(1), n]
                .into_iter()
                .filter(|&l| l >= 1 && l <= n)
                .collect();
            v.dedup();
            let rest = m.saturating_sub(v.len() as u32);
            let mut more = spread(rest + 2, n);
            more.pop();
            more.remove(0);
            // Interleave: short, long, short, long ...
            let (lo, hi) = more.split_at(more.len() / 2);
            let mut hi = hi.iter().rev();
            for &l in lo {
                v.push(l);
                v.extend(hi.next());
            }
            v.extend(hi);
            v.truncate(m as usize);
            // Too few requests for every edge case: the last is the longest.
            if !v.contains(&n) {
                if let Some(last) = v.last_mut() {
                    *last = n;
                }
            }
            v
        }
        "decode-skew" => {
            let mut v = spread(m.saturating_sub(1), (n / 32).max(1));
            v.insert((m / 2) as usize, n);
            v.truncate(m as usize);
            v
        }
        _ => vec![n; m as usize],
    }
}

/// The named decode workload's shape: `m` requests, longest `n`, head
/// dimension `k`, page size `tile`, 32 query and 8 KV heads.
pub fn shape_of(name: &str, p: &Params) -> DecodeShape {
    DecodeShape {
        lengths: lengths_of(name, p.m, p.n),
        q_heads: Q_HEADS,
        kv_heads: KV_HEADS,
        d: p.k,
        page: p.tile,
    }
}

/// Cube cores the named workloads plan for.
pub const PLAN_CORES: u32 = 8;

/// Builds `decode`, `decode-uniform` or `decode-skew` from `p` (see
/// [`shape_of`]), planned for [`PLAN_CORES`] cube cores.
pub fn named(name: &'static str, p: Params) -> Result<Workload, WorkloadError> {
    named_with(name, p, Strategy::Planned { cores: PLAN_CORES })
}

/// The decode workloads [`named`] builds: their lengths are
/// [`lengths_of`]'s.
pub const NAMES: [&str; 3] = ["decode", "decode-uniform", "decode-skew"];

/// As [`named`], split by `strategy`. An unknown name, and a planned
/// strategy for 0 cores, are refused.
pub fn named_with(
    name: &'static str,
    p: Params,
    strategy: Strategy,
) -> Result<Workload, WorkloadError> {
    if !NAMES.contains(&name) {
        return Err(WorkloadError::Params(format!(
            "no decode workload named `{name}` (the names are {})",
            NAMES.join(", ")
        )));
    }
    if p.m == 0 || p.n == 0 {
        return Err(WorkloadError::Params(format!(
            "m (requests) = {} and n (longest KV length) = {} must be positive",
            p.m, p.n
        )));
    }
    if let Strategy::Planned { cores: 0 } = strategy {
        return Err(WorkloadError::Params(
            "the planner's strategy was given 0 cores to plan for (at least 1)".into(),
        ));
    }
    let shape = shape_of(name, &p);
    let data = DecodeData::build(shape.clone(), p.seed)
        .map_err(|e| WorkloadError::Params(e.to_string()))?;
    let plan = Plan::new(&data.shape, strategy).map_err(WorkloadError::Params)?;
    // The reference rebuilds the data from its seed when the check runs.
    let rebuild = move || DecodeData::build(shape.clone(), p.seed).expect("built once already");
    decode_workload_with(name, &data, &plan, rebuild)
}
