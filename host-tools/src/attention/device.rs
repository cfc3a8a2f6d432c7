//! The decode planner on the device: for when the requests' KV lengths
//! are known only there (e.g. written by an earlier step's tasks). A
//! program reads the lengths from a tensor, plans the chunk size with the
//! `decode_plan` kernel (the host planner's rule, [`super::plan`], in the
//! same integer arithmetic) and expands the partial and merge tasks:
//!
//! ```text
//! decode_plan(lens -> plan)                       (kernel: the chunk size c)
//! c = load plan[0]                                (waits for the plan task)
//! parallel b in 0..B:
//!     len = load lens[b]; chunks = ceil(len / c)
//!     parallel h in 0..kv_heads:
//!         when chunks <= 1:
//!             attn_decode_partial(q[b, h], kv[h], meta[2b], out[b, h]; 0, len)
//!         otherwise:
//!             parallel i in 0..chunks:             (a Count axis)
//!                 attn_decode_partial(..., parts[b, h, i]; i c, min(c, len - i c))
//!             attn_merge(parts[b, h, 0..chunks] -> out[b, h]; chunks)
//! ```
//!
//! The tensors are those of the host-planned table ([the module
//! layout](super)) with two more, `lens` (i32 `[1, B]`, an input) and
//! `plan` (i32 `[1, 1]`); `parts` gives every (request, KV head) room for
//! the most chunks any length can need (`ceil(W P / min_chunk)`), since
//! the device cannot pack them without the lengths' prefix sums. Each
//! partial state is computed from the same tokens, and each merge merges
//! the same states in the same order, as in the host plan with the same
//! chunk, so the final states are bit-identical to the host plan's.

use std::num::NonZeroU32;

use wsp_ffi::WspKernelId_WSP_KERNEL_DECODE_PLAN as DECODE_PLAN;

use super::kv::DecodeData;
use super::plan::{min_chunk, CostModel};
use super::reference;
use super::sparse::failed;
use super::workload::{MERGE, PARTIAL};
use crate::program::{Axis, Expr, LowerError, Region, Workload as Program};
use crate::table::{product, Arena, TensorId};
use crate::workloads::{Verification, Workload, WorkloadError};

/// The tensors of the device-planned program, in declaration order. They
/// hold the same bytes as the host-planned table's ([the module
/// layout](super)), seen with more dimensions so that a call's regions are
/// offsets by loop indices alone: the program machine has 16 registers,
/// and every offset, extent and scalar of a call takes one while it runs.
#[derive(Clone, Copy, Debug)]
pub struct DeviceTensors {
    /// The tensors [`attention_calls`] reads and writes.
    pub attn: AttnTensors,
    /// i32 `[1, 1]`: the chunk size `decode_plan` chose.
    pub plan: TensorId,
}

/// The tensors of one device-planned decode attention.
#[derive(Clone, Copy, Debug)]
pub struct AttnTensors {
    /// `[B, q_heads, D]`: `[B * q_heads, D]`.
    pub q: TensorId,
    /// `[kv_heads, pages * 2P, D]`.
    pub kv: TensorId,
    /// i32 `[B, 2, W]`: `[2B, W]`.
    pub meta: TensorId,
    /// `[B, q_heads, D + 2]`: the final states, `[B * q_heads, D + 2]`.
    pub out: TensorId,
    /// `[B * kv_heads, max_chunks * G, D + 2]`: partial states.
    pub parts: TensorId,
    /// i32 `[1, B]`: the lengths, read on the device.
    pub lens: TensorId,
}

/// The sizes [`attention_calls`] needs.
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    /// Requests.
    pub batch: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Query heads per KV head.
    pub group: u32,
    /// Head dimension.
    pub d: u32,
    /// Tokens per page.
    pub page: u32,
    /// Rows of one KV head's pool.
    pub pool: u32,
    /// Page table width.
    pub width: u32,
    /// The most chunks a request may be split into ([`max_chunks`]).
    pub most: u32,
}

impl AttnDims {
    /// The sizes of `data`'s decode step (of data [`DecodeData::check`]
    /// accepts; [`DecodeData::pool_rows`] says what the pool is otherwise).
    pub fn of(data: &DecodeData) -> AttnDims {
        let s = &data.shape;
        AttnDims {
            batch: s.batch(),
            kv_heads: s.kv_heads,
            group: s.group(),
            d: s.d,
            page: s.page,
            pool: data.pool_rows(),
            width: data.width,
            most: max_chunks(data),
        }
    }
}

/// The most chunks a request of the shape's page-table width can need:
/// [`most_chunks`] of its width and page size.
pub fn max_chunks(data: &DecodeData) -> u32 {
    most_chunks(data.width, data.shape.page)
}

/// The most chunks a request can need in a page table of `width` pages of
/// `page` tokens: `ceil(W P / min_chunk)`, exact for any sizes (a shape
/// its check refused included): `W P` is taken in u64, where it cannot
/// overflow, and the count is at most `W`, since a chunk holds at least a
/// page. 0 for pages of 0 tokens (which hold none; [`DecodeData::check`]
/// refuses them).
pub fn most_chunks(width: u32, page: u32) -> u32 {
    let Some(p) = NonZeroU32::new(page) else {
        return 0;
    };
    let chunks = (u64::from(width) * u64::from(page)).div_ceil(u64::from(min_chunk(p).get()));
    // min_chunk(p) >= p, so chunks <= width: the `min` changes nothing.
    chunks.min(u64::from(width)) as u32
}

/// `decode_plan`'s most KV heads.
pub const MAX_PLAN_HEADS: u32 = 256;
/// `decode_plan`'s most cores.
pub const MAX_PLAN_CORES: u32 = 4096;
/// `decode_plan`'s largest page size.
pub const MAX_PLAN_PAGE: u32 = 65536;
/// `decode_plan`'s most requests.
pub const MAX_PLAN_REQUESTS: u32 = 4096;

/// Refuses sizes `decode_plan` does not take, naming them: `batch`
/// requests, `kv_heads`, pages of `page` tokens, `cores` (the kernel
/// would refuse them only when the run reaches it).
pub fn check_plan(batch: u32, kv_heads: u32, page: u32, cores: u32) -> Result<(), String> {
    for (what, v, max) in [
        ("requests", batch, MAX_PLAN_REQUESTS),
        ("KV heads", kv_heads, MAX_PLAN_HEADS),
        ("tokens per page", page, MAX_PLAN_PAGE),
        ("cores", cores, MAX_PLAN_CORES),
    ] {
        if !(1..=max).contains(&v) {
            return Err(format!(
                "{v} {what}: the device planner (decode_plan) takes 1 ..= {max}"
            ));
        }
    }
    Ok(())
}

/// Adds one `decode_plan` call planning for `cores` cores: it reads
/// `lens` and writes the chunk size into `plan` (sizes as
/// [`check_plan`] takes them). A group and head dimension whose
/// [`CostModel`] does not fit the kernel's two 32-bit halves fail the
/// program's `finish`.
pub fn plan_call(w: &mut Program, dims: &AttnDims, lens: TensorId, plan: TensorId, cores: u32) {
    let cost = match CostModel::of(dims.group, dims.d) {
        Ok(c) if c.item <= u32::MAX as u64 && c.token <= u32::MAX as u64 => c,
        other => {
            let why = match other {
                Err(e) => e,
                Ok(c) => format!("the cost {c:?} does not fit two 32-bit halves"),
            };
            w.fail(LowerError::Call {
                kernel: "decode_plan".into(),
                why,
            });
            return;
        }
    };
    w.call(
        DECODE_PLAN,
        &[lens.tile(0, 0, 1, dims.batch), plan.tile(0, 0, 1, 1)],
        &[
            Expr::Const(dims.kv_heads as i64),
            Expr::Const(cores as i64),
            Expr::Const(dims.page as i64),
            Expr::Const((cost.item | cost.token << 32) as i64),
        ],
    );
}

/// Adds the partial and merge calls of one decode attention in chunks of
/// `c` tokens (an expression: e.g. the chunk `decode_plan` wrote, loaded).
/// A head dimension whose state rows of `D + 2` values pass `u32` (only a
/// hand-built [`AttnDims`] has one) fails the program's `finish`; the
/// other sizes enter the program as 64-bit constants, which its lowering
/// and the device check.
pub fn attention_calls(w: &mut Program, t: &AttnTensors, dims: &AttnDims, c: &Expr) {
    let Some(state) = dims.d.checked_add(2) else {
        w.fail(LowerError::Call {
            kernel: "attn_decode_partial".into(),
            why: format!(
                "head dimension {}: its state rows of D + 2 values pass u32",
                dims.d
            ),
        });
        return;
    };
    let &AttnDims {
        batch: b,
        kv_heads: kvh,
        group: g,
        d,
        page,
        pool,
        width,
        most,
    } = dims;
    let scale = Expr::Const(((1.0 / (d as f64).sqrt()) as f32).to_bits() as i64);
    let zero = || Expr::Const(0);
    w.parallel(Axis::Dense(b), |w, r| {
        // Read where used (a load is one instruction), not held: registers.
        let len = || Expr::load(t.lens, vec![Expr::Const(0), r.clone()]);
        let chunks = || (len() + c.clone() - 1) / c.clone();
        w.parallel(Axis::Dense(kvh), |w, h| {
            let at = |t: TensorId, cols: u32| Region {
                tensor: t,
                offset: vec![r.clone(), h.clone() * g, zero()],
                rows: g.into(),
                cols: cols.into(),
            };
            let partial = |w: &mut Program, part: Region, first: Expr, n: Expr| {
                let kv = Region {
                    tensor: t.kv,
                    offset: vec![h.clone(), zero(), zero()],
                    rows: pool.into(),
                    cols: d.into(),
                };
                let meta = Region {
                    tensor: t.meta,
                    offset: vec![r.clone(), zero(), zero()],
                    rows: 1.into(),
                    cols: width.into(),
                };
                w.call(
                    PARTIAL,
                    &[at(t.q, d), kv, meta, part],
                    &[first, n, Expr::Const(page as i64), scale.clone()],
                );
            };
            w.when(
                chunks().le(1),
                |w| partial(w, at(t.out, state), zero(), len()),
                |w| {
                    let group = || r.clone() * kvh + h.clone();
                    w.parallel(
                        Axis::Count {
                            count: chunks(),
                            max: most,
                        },
                        |w, i| {
                            let first = || i.clone() * c.clone();
                            let part = Region {
                                tensor: t.parts,
                                offset: vec![group(), i.clone() * g, zero()],
                                rows: g.into(),
                                cols: state.into(),
                            };
                            partial(w, part, first(), (len() - first()).min(c.clone()));
                        },
                    );
                    let parts = Region {
                        tensor: t.parts,
                        offset: vec![group(), zero(), zero()],
                        rows: chunks() * g,
                        cols: state.into(),
                    };
                    w.call(MERGE, &[parts, at(t.out, state)], &[chunks()]);
                },
            );
        });
    });
}

/// The program of the device planner for `data`'s shape, planning for
/// `cores` cores that run partials. Data [`DecodeData::check`] refuses is
/// refused, and so are sizes the table cannot hold.
pub fn decode_program(
    data: &DecodeData,
    cores: u32,
) -> Result<(Program, DeviceTensors), WorkloadError> {
    data.check()
        .map_err(|e| WorkloadError::Params(e.to_string()))?;
    let lower = |e: LowerError| WorkloadError::Params(e.to_string());
    let s = &data.shape;
    let dims = AttnDims::of(data);
    let (b, d, kvh) = (s.batch(), s.d, s.kv_heads);
    // Checked: D <= 128, and the pool fits u32 rows. The parts' rows are
    // products the checks leave unbounded (W is the meta buffer's).
    let groups = product("parts: requests x KV heads", &[b, kvh])?;
    let rows = product("parts: most chunks x group", &[dims.most, dims.group])?;
    let mut w = Program::new();
    let mut tensors = || -> Result<AttnTensors, LowerError> {
        Ok(AttnTensors {
            q: w.tensor("q", &[b, s.q_heads, d])?,
            kv: w.tensor("kv", &[kvh, dims.pool, d])?,
            meta: w.tensor_i32("meta", &[b, 2, dims.width])?,
            out: w.tensor("out", &[b, s.q_heads, d + 2])?,
            parts: w.tensor("parts", &[groups, rows, d + 2])?,
            lens: w.tensor_i32("lens", &[1, b])?,
        })
    };
    let attn = tensors().map_err(lower)?;
    let t = DeviceTensors {
        attn,
        plan: w.tensor_i32("plan", &[1, 1]).map_err(lower)?,
    };
    w.input(attn.lens);
    plan_call(&mut w, &dims, attn.lens, t.plan, cores);
    let c = w.let_(Expr::load(t.plan, vec![Expr::Const(0), Expr::Const(0)]));
    attention_calls(&mut w, &attn, &dims, &c);
    Ok((w, t))
}

/// The device-planned decode of `data` for `cores` cores (sizes past
/// [`check_plan`]'s are refused), checked against
/// the f64 reference like the host-planned one. The chunk the device
/// plans is not known when the check is built: the bound assumes the
/// most chunks any (request, KV head) may have, which only loosens it.
pub fn device_decode_workload(
    name: &'static str,
    data: &DecodeData,
    cores: u32,
) -> Result<Workload, WorkloadError> {
    data.check()
        .map_err(|e| WorkloadError::Params(e.to_string()))?;
    let s = &data.shape;
    check_plan(s.batch(), s.kv_heads, s.page, cores).map_err(WorkloadError::Params)?;
    let lower = |e: LowerError| WorkloadError::Params(e.to_string());
    let (mut w, t) = decode_program(data, cores)?;
    let table = w.finish().map_err(lower)?;
    let mut arena = Arena::zeroed(w.arena_size());
    let a = &t.attn;
    arena.write_f32(w.layout(a.q), &data.q);
    arena.write_f32(w.layout(a.kv), &data.kv);
    arena.write_i32(w.layout(a.meta), &data.meta);
    let lens: Vec<i32> = data.shape.lengths.iter().map(|&l| l as i32).collect();
    arena.write_i32(w.layout(a.lens), &lens);
    let s = data.shape.clone();
    let d = s.d as usize;
    let most = max_chunks(data);
    let copy = data.clone();
    let out = w.layout(t.attn.out).clone();
    let check = move |arena: &Arena| {
        let want = match reference::attention(&copy) {
            Ok(r) => r,
            Err(e) => return failed(format!("the f64 reference: {e}"), reference::TOLERANCE),
        };
        // Made by the reference: its sizes are right.
        let bound = reference::bound_unchecked(&want, |_| most);
        let got: Vec<f32> = arena
            .read_f32(&out)
            .chunks_exact(d + 2)
            .flat_map(|row| row[..d].to_vec())
            .collect();
        Verification::compare("out", &got, &want.o, |i| bound[i], reference::TOLERANCE)
    };
    let total: u64 = s.lengths.iter().map(|&l| l as u64).sum();
    Ok(Workload {
        name,
        summary: format!(
            "decode attention planned on the device: {} requests, {total} KV tokens, {} query / {} KV heads, \
             D {}, pages of {}; chunk chosen by decode_plan for {cores} cores",
            s.batch(),
            s.q_heads,
            s.kv_heads,
            s.d,
            s.page
        ),
        table,
        arena,
        tensors: w.layouts().to_vec(),
        // What the host planner's rule predicts: the planning task, the
        // partials and merges of the same chunk.
        tasks: {
            let s = &data.shape;
            let cost = CostModel::of(s.group(), s.d).map_err(WorkloadError::Params)?;
            let chunk = super::plan::choose_chunk(&s.lengths, s.kv_heads, cores, s.page, cost)
                .map_err(WorkloadError::Params)?;
            let plan = super::plan::Plan::with_chunk(s, chunk);
            1 + plan.items.len() + plan.merges()
        },
        check: Box::new(check),
        csp: Default::default(),
    })
}

/// `decode-device`: the `decode` batch (see
/// [`super::workload::shape_of`]), planned on the device for
/// [`super::workload::PLAN_CORES`] cores.
pub fn named(p: crate::workloads::Params) -> Result<Workload, WorkloadError> {
    if p.m == 0 || p.n == 0 {
        return Err(WorkloadError::Params(format!(
            "m (requests) = {} and n (longest KV length) = {} must be positive",
            p.m, p.n
        )));
    }
    let shape = super::workload::shape_of("decode", &p);
    let data =
        DecodeData::build(shape, p.seed).map_err(|e| WorkloadError::Params(e.to_string()))?;
    device_decode_workload("decode-device", &data, super::workload::PLAN_CORES)
}
