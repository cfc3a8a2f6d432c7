//! Bounds on a built-in workload's sizes, checked before anything is
//! built: its tensors may take at most [`MAX_ARENA_BYTES`] (the arena,
//! and the heap ring where it has one), and it may run at most
//! [`MAX_TASKS`] tasks. [`footprint`] works both out from the sizes alone,
//! with no data made and no table built; [`check`] refuses sizes past
//! either bound with an error naming the sizes, what they need and the
//! bound.
//!
//! Sizes that a workload's builder refuses anyway (a tile out of its
//! range, a head dimension past the kernels') are left to the builder,
//! whose message names them: [`footprint`] has no figure for them.

use std::num::NonZeroU32;

use crate::attention::plan::min_chunk;
use crate::model::layer::{LayerShape, Mlp, DEFAULT_LAYERS, NORM_ROWS, TILE};
use crate::moe_layer::MoeConfig;
use crate::workloads::{sizes_read, Params, WorkloadError};

/// The most bytes a built-in workload's tensors may take: 1 GiB. The
/// defaults take at most 328 MB (`decode-device`'s).
pub const MAX_ARENA_BYTES: u64 = 1 << 30;

/// The most tasks a built-in workload may run: 2^20. The defaults run at
/// most 6,473 (`decode-layer`'s).
pub const MAX_TASKS: u64 = 1 << 20;

/// A bound of a built-in workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// [`MAX_ARENA_BYTES`].
    Bytes,
    /// [`MAX_TASKS`].
    Tasks,
}

impl Bound {
    /// `needs` of what the bound counts, e.g. `up to 1064960 tasks`.
    pub fn amount(self, needs: u128) -> String {
        match self {
            Bound::Bytes => format!("{needs} bytes of tensors"),
            Bound::Tasks => format!("up to {needs} tasks"),
        }
    }
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bound::Bytes => write!(
                f,
                "a built-in workload may take at most {MAX_ARENA_BYTES} (1 GiB)"
            ),
            Bound::Tasks => write!(f, "a built-in workload may run at most {MAX_TASKS} (2^20)"),
        }
    }
}

/// What a built-in workload of some sizes needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes of its tensors: the arena's size, within the 64-byte
    /// alignment of each tensor (the decode workloads' partial states
    /// counted as if every request were split).
    pub arena: u128,
    /// Tasks it runs: exactly, or at most where the device decides
    /// (routing, the attention planner's chunk).
    pub tasks: u128,
}

/// What the workload called `name` needs with sizes `p`: `None` for sizes
/// its builder refuses itself, for the fixed-size examples (`wsp9-*`) and
/// for names that are no built-in workload. When the `m` requests of a
/// decode workload alone run more than [`MAX_TASKS`] tasks, `arena` is 0:
/// their lengths are not listed.
pub fn footprint(name: &str, p: &Params) -> Option<Footprint> {
    footprint_with(name, p, DEFAULT_LAYERS)
}

/// [`footprint`] with `layers` layers for the decode-layer workloads
/// (the others have no layers: `layers` changes nothing for them).
fn footprint_with(name: &str, p: &Params, layers: u32) -> Option<Footprint> {
    let bytes = |elements: u128, tasks: u128| {
        Some(Footprint {
            arena: 4 * elements,
            tasks,
        })
    };
    let (m, n, k) = (p.m as u128, p.n as u128, p.k as u128);
    let tiled = (1..=64).contains(&p.tile);
    let tiles = |v: u32| v.div_ceil(p.tile) as u128;
    let gemm_tasks = || tiles(p.m) * tiles(p.n) * tiles(p.k);
    match name {
        "gemm" if tiled => bytes(m * k + k * n + m * n, gemm_tasks()),
        "mlp" | "mlp-scratch" if tiled && p.n <= 1024 => {
            // Y, Z and N on the heap ring take two m x n at once.
            let inter = if name == "mlp" { 3 } else { 2 };
            let adds = tiles(p.m) * tiles(p.n);
            let rows = p.m.div_ceil(16) as u128;
            bytes(
                m * k + k * n + (2 + inter) * m * n + n,
                gemm_tasks() + adds + 2 * rows,
            )
        }
        "streams" if tiled => bytes(
            2 * m * k + 2 * k * n + 3 * m * n,
            2 * gemm_tasks() + tiles(p.m) * tiles(p.n),
        ),
        "moe" | "moe-var" if [p.m, p.n, p.k].iter().all(|v| (1..=64).contains(v)) => {
            let (e, top) = (
                crate::moe::EXPERTS as u128,
                if name == "moe" { 2 } else { 4 },
            );
            // x, wg, logits, indptr, tokens, weights, w, out.
            let elements = m * k + k * e + m * e + e + 1 + 2 * top * m + e * k * n + m * n;
            bytes(elements, 2 + top * m)
        }
        "pipeline" if tiled => {
            // x, squared and out; zero; the staging slots at the default depth.
            let depth = crate::pipeline::DEFAULT_DEPTH;
            let (t, slots) = (p.tile as u128, crate::pipeline::slots(depth) as u128);
            bytes(
                3 * tiles(p.m) * t * t + t * t + slots * t * t,
                3 * tiles(p.m),
            )
        }
        "attention-pipeline" if (1..=16).contains(&p.m) => {
            let d = crate::attention_pipeline::D as u128;
            let kv_tiles = p.n.div_ceil(crate::attention_pipeline::D) as u128;
            // q, kT and v, the staging slots (kt, s, p, o), zero and out.
            let slots = 2;
            let elements = m * d
                + 2 * kv_tiles * d * d
                + slots * (d * d + 3 * m * d)
                + d * d
                + kv_tiles * m * d;
            bytes(elements, 7 * kv_tiles)
        }
        "decode" | "decode-uniform" | "decode-skew" | "decode-device" => decode(name, p),
        "sparse-decode" => sparse(p),
        "moe-layer" | "moe-layer-var" => {
            let cfg = crate::moe_layer::config(name, p);
            cfg.check().ok()?;
            let t = cfg.tokens as u128;
            let h = cfg.hidden as u128;
            bytes(2 * t * h + moe_ffn(&cfg)?, cfg.most_tasks().ok()? as u128)
        }
        "decode-layer" | "decode-layer-dense" => {
            let mlp = if name == "decode-layer" {
                Mlp::Moe(crate::model::MOE)
            } else {
                Mlp::Dense
            };
            let shape = LayerShape {
                layers,
                ..crate::model::layer::shape_of(p, mlp).ok()?
            };
            shape.check().ok()?;
            let f = step(&shape, &shape.lengths)?;
            bytes(f.arena, f.tasks)
        }
        "stitched" => {
            let [decode, chunk] = crate::model::stitch::shapes(p).ok()?;
            decode.check().ok()?;
            chunk.check().ok()?;
            let longest = chunk.lengths.iter().copied().max().unwrap_or(0);
            let (a, b) = (step(&decode, &decode.lengths)?, step(&chunk, &[longest])?);
            bytes(a.arena + b.arena, a.tasks + b.tasks)
        }
        _ => None,
    }
}

/// Refuses sizes whose workload would take more than [`MAX_ARENA_BYTES`]
/// or run more than [`MAX_TASKS`] tasks ([`footprint`]), naming the sizes
/// the workload reads, what they need and the bound.
pub fn check(name: &str, p: &Params) -> Result<(), WorkloadError> {
    check_with(name, p, None)
}

/// [`check`] for a decode-layer workload (`decode-layer`,
/// `decode-layer-dense`) of `layers` layers; the error names them with
/// the sizes.
pub fn check_layers(name: &str, p: &Params, layers: u32) -> Result<(), WorkloadError> {
    check_with(name, p, Some(layers))
}

fn check_with(name: &str, p: &Params, layers: Option<u32>) -> Result<(), WorkloadError> {
    let Some(f) = footprint_with(name, p, layers.unwrap_or(DEFAULT_LAYERS)) else {
        return Ok(());
    };
    let sizes = || {
        let values = [("m", p.m), ("n", p.n), ("k", p.k), ("tile", p.tile)];
        let read = sizes_read(name).0;
        let mut sizes: Vec<String> = values
            .iter()
            .filter(|(size, _)| read.contains(size))
            .map(|(size, v)| format!("{size} = {v}"))
            .collect();
        sizes.extend(layers.map(|l| format!("layers = {l}")));
        sizes.join(", ")
    };
    for (needs, limit, bound) in [
        (f.tasks, MAX_TASKS, Bound::Tasks),
        (f.arena, MAX_ARENA_BYTES, Bound::Bytes),
    ] {
        if needs > limit as u128 {
            return Err(WorkloadError::TooLarge {
                sizes: sizes(),
                bound,
                needs,
            });
        }
    }
    Ok(())
}

/// Sums over a batch's KV lengths for pages of `page` tokens.
struct Kv {
    /// Pages of all requests.
    pages: u128,
    /// The most pages of one request (the page table's width).
    width: u128,
    /// Chunks of all requests at the planner's smallest chunk.
    chunks: u128,
    /// The most chunks of one request: `ceil(width x page / min_chunk)`.
    most: u128,
}

fn kv(lengths: &[u32], page: NonZeroU32) -> Kv {
    let chunk = min_chunk(page).get();
    let page = page.get();
    let pages = |len: &u32| len.div_ceil(page) as u128;
    let width = lengths.iter().map(pages).max().unwrap_or(0);
    Kv {
        pages: lengths.iter().map(pages).sum(),
        width,
        chunks: lengths.iter().map(|len| len.div_ceil(chunk) as u128).sum(),
        most: (width * page as u128).div_ceil(chunk as u128),
    }
}

/// `decode`, `decode-uniform`, `decode-skew` (planned on the host) and
/// `decode-device`: q, the paged pool, the page tables, out and the
/// partial states; a partial per chunk and a merge per split (request,
/// KV head), and the device's planning task.
/// An attention workload has at least a partial per (request, KV head):
/// past the task cap with `partials` of them, the footprint that says so,
/// worked out before any length is listed.
fn partials_past_the_cap(partials: u128) -> Option<Footprint> {
    (partials > MAX_TASKS as u128).then_some(Footprint {
        arena: 0,
        tasks: partials,
    })
}

fn decode(name: &str, p: &Params) -> Option<Footprint> {
    use crate::attention::workload::{lengths_of, KV_HEADS, Q_HEADS};
    let tile = NonZeroU32::new(p.tile)?;
    if p.m == 0 || p.n == 0 || !(1..=crate::attention::kv::MAX_DIM).contains(&p.k) {
        return None;
    }
    let (b, kvh, qh) = (p.m as u128, KV_HEADS as u128, Q_HEADS as u128);
    if let Some(refused) = partials_past_the_cap(b * kvh) {
        return Some(refused);
    }
    let device = name == "decode-device";
    let lengths = lengths_of(if device { "decode" } else { name }, p.m, p.n);
    let (d, page) = (p.k as u128, p.tile as u128);
    let s = kv(&lengths, tile);
    let parts = if device {
        b * qh * s.most * (d + 2)
    } else {
        qh * s.chunks * (d + 2)
    };
    let elements =
        b * qh * d + kvh * s.pages * 2 * page * d + 2 * b * s.width + b * qh * (d + 2) + parts;
    let tasks = kvh * s.chunks + b * kvh;
    Some(if device {
        Footprint {
            arena: 4 * (elements + b + 1),
            tasks: tasks + 1,
        }
    } else {
        Footprint {
            arena: 4 * elements,
            tasks,
        }
    })
}

/// `sparse-decode`: q, the paged pool, the page tables (wide enough for
/// the selected positions), out, the indexer's queries, weights, keys and
/// scores, and the lengths.
fn sparse(p: &Params) -> Option<Footprint> {
    use crate::attention::sparse::{lengths_of, task_count, Tiers};
    use crate::attention::sparse::{INDEX_DIM, INDEX_HEADS, KV_HEADS, Q_HEADS};
    let tiers = Tiers::full();
    let tile = NonZeroU32::new(p.tile)?;
    if p.m == 0
        || p.n == 0
        || p.n > tiers.longest()
        || !(1..=crate::attention::kv::MAX_DIM).contains(&p.k)
    {
        return None;
    }
    let (b, kvh, qh) = (p.m as u128, KV_HEADS as u128, Q_HEADS as u128);
    if let Some(refused) = partials_past_the_cap(b * kvh) {
        return Some(refused);
    }
    let lengths = lengths_of(p.m, p.n, &tiers);
    let (d, page) = (p.k as u128, p.tile as u128);
    let (h, dq) = (INDEX_HEADS as u128, INDEX_DIM as u128);
    let s = kv(&lengths, tile);
    let total: u128 = lengths.iter().map(|&l| l as u128).sum();
    let width = s.width.max(tiers.k_max as u128);
    let elements = b * qh * d
        + kvh * s.pages * 2 * page * d
        + 2 * b * width
        + b * qh * (d + 2)
        + b * h * dq
        + b * h
        + total * (dq + 1)
        + 2 * b;
    Some(Footprint {
        arena: 4 * elements,
        tasks: task_count(&tiers, &lengths, KV_HEADS).ok()? as u128,
    })
}

/// Elements of an MoE block's tensors ([`crate::moe_layer::moe_ffn`]):
/// the router and experts' weights, the logits and gate weights, the
/// padded rows' buffers, the shared expert's weights and buffers, and
/// the i32 routing tensors; none for a config whose padded rows are
/// refused.
fn moe_ffn(c: &MoeConfig) -> Option<u128> {
    let [t, h, f, e, k, m, p, s] = [
        c.tokens,
        c.hidden,
        c.ffn,
        c.experts,
        c.top_k,
        c.tile,
        c.padded_rows().ok()?,
        c.shared_ffn,
    ]
    .map(u128::from);
    Some(
        h * e
            + 3 * e * h * f
            + t * e
            + t * k
            + 2 * m
            + 2 * p * h
            + 3 * p * f
            + 3 * h * s
            + 3 * t * s
            + 2 * t * k
            + e
            + 1
            + p,
    )
}

/// One decode step of `s` (the decode layers), its KV cache holding
/// `cached` (the requests' lengths; a prefill chunk's rows share one
/// request's pages): elements (not bytes) and tasks, counted as
/// [`crate::model::layer::task_count`] does with the most chunks and
/// expert tiles.
fn step(s: &LayerShape, cached: &[u32]) -> Option<Footprint> {
    let [b, h, qkv, d, f, qh, kvh, layers, page] = [
        s.batch(),
        s.hidden(),
        s.qkv(),
        s.d,
        s.ffn,
        s.q_heads,
        s.kv_heads,
        s.layers,
        s.page,
    ]
    .map(u128::from);
    let pages_of = NonZeroU32::new(s.page)?;
    let (cache, attention) = (kv(cached, pages_of), kv(&s.lengths, pages_of));
    let tile = TILE as u128;
    let (rb, ht, ft, qt) = (b.div_ceil(tile), h / tile, f / tile, qkv / tile);
    let (mlp, mlp_scratch, mlp_tasks) = match s.moe() {
        None => (3 * h * f, 3 * b * f, rb * (2 * ft * ht + ft + ht + ht * ft)),
        Some(cfg) => (
            moe_ffn(&cfg)?,
            b * h,
            cfg.most_tasks().ok()? as u128 + rb * ht,
        ),
    };
    // Norm gains, QKV and output projections, the cache and the partial states.
    let weights =
        2 * h + h * qkv + h * h + kvh * cache.pages * 2 * page * d + b * qh * cache.most * (d + 2);
    // The heap ring: a layer's scratch tensors, the largest once more, and
    // the stream between layers.
    let scratch = b * (5 * h + qkv + qh * d + qh * (d + 2)) + mlp_scratch;
    let heap = scratch + b * qkv.max(qh * (d + 2)).max(f) + 2 * b * h;
    let longest = s.lengths.iter().copied().max().unwrap_or(0) as u128;
    // x in and out, the page tables, the lengths, the plan, cos/sin.
    let step = 2 * b * h + 2 * b * cache.width + b + 1 + longest * d;
    let norms = 2 * b.div_ceil(NORM_ROWS as u128);
    let rope = b * (1 + 2 * kvh);
    let attn = kvh * attention.chunks + b * kvh;
    let half = norms + rb * qt * ht + rope + attn + b + rb * (ht + ht * ht);
    Some(Footprint {
        arena: step + heap + layers * (weights + mlp),
        tasks: 1 + layers * (half + mlp_tasks),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::{Workload, NAMES};

    /// The footprint against the workload built, for every built-in
    /// workload at its defaults and at other sizes: the arena within 10%
    /// (the decode workloads' partial states are counted as if every
    /// request were split), no fewer tasks than the build counts and at
    /// most twice as many (the planner's chunk and the routing are the
    /// device's), and none for the fixed-size examples. The sizes are
    /// small enough for a debug build.
    #[test]
    fn the_footprint_is_what_the_build_takes() {
        let mut cases: Vec<(&str, Params)> = NAMES
            .iter()
            .filter(|n| !n.starts_with("decode") && !n.starts_with("sparse"))
            .map(|&n| (n, Params::of(n).unwrap()))
            .collect();
        let sized = |m, n, k, tile| Params {
            m,
            n,
            k,
            tile,
            seed: 1,
        };
        cases.extend([
            ("gemm", sized(96, 64, 160, 32)),
            ("mlp", sized(48, 96, 64, 16)),
            ("mlp-scratch", sized(48, 96, 64, 16)),
            ("streams", sized(64, 32, 96, 32)),
            ("moe-var", sized(17, 9, 40, 32)),
            ("pipeline", sized(96, 32, 32, 32)),
            ("attention-pipeline", sized(5, 320, 64, 64)),
            ("decode", sized(6, 300, 64, 16)),
            ("decode-uniform", sized(4, 200, 32, 64)),
            ("decode-skew", sized(5, 700, 64, 32)),
            ("decode-device", sized(6, 300, 64, 16)),
            ("sparse-decode", sized(4, 3000, 64, 64)),
            ("moe-layer", sized(64, 64, 64, 8)),
            ("moe-layer-var", sized(40, 128, 128, 4)),
            ("decode-layer", sized(6, 300, 128, 16)),
            ("decode-layer-dense", sized(6, 300, 128, 32)),
            ("stitched", sized(6, 64, 128, 16)),
        ]);
        for (name, p) in cases {
            let w = Workload::build(name, p).unwrap();
            let f = footprint(name, &p);
            if name.starts_with("wsp9-") {
                assert_eq!(f, None, "{name}");
                continue;
            }
            let f = f.unwrap_or_else(|| panic!("{name} {p:?}: no footprint"));
            let (arena, tasks) = (w.arena.bytes.len() as f64, w.tasks as f64);
            let ratio = f.arena as f64 / arena;
            assert!(
                (0.9..=1.1).contains(&ratio),
                "{name} {p:?}: {f:?}, arena {arena}"
            );
            let ratio = f.tasks as f64 / tasks;
            assert!(
                (1.0..=2.0).contains(&ratio),
                "{name} {p:?}: {f:?}, {tasks} tasks"
            );
        }
    }

    /// A workload at the bounds is built; one byte or one task past them
    /// is refused before anything is built, the message naming the sizes,
    /// the need and the bound. gemm's footprint is exact: 4 (mk + kn + mn)
    /// bytes and (m/t)(n/t)(k/t) tasks.
    #[test]
    fn sizes_at_the_bounds_pass_and_one_past_is_refused() {
        // Every workload's defaults are well within both.
        for name in NAMES {
            let p = Params::of(name).unwrap();
            if let Some(f) = footprint(name, &p) {
                assert!(f.arena <= MAX_ARENA_BYTES as u128 / 3, "{name}: {f:?}");
                assert!(f.tasks <= MAX_TASKS as u128 / 16, "{name}: {f:?}");
            }
        }
        let gemm = |m, n, k, tile| Params {
            m,
            n,
            k,
            tile,
            seed: 1,
        };
        // 2^20 tasks: 128 x 128 x 64 tiles of 1 (an arena of 160 KiB).
        assert!(check("gemm", &gemm(128, 128, 64, 1)).is_ok());
        let e = check("gemm", &gemm(128, 128, 65, 1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "m = 128, n = 128, k = 65, tile = 1 need up to 1064960 tasks; \
             a built-in workload may run at most 1048576 (2^20)"
        );
        // 4 (mk + kn + mn) = 2^30 bytes: m = 130560, n = k = 1024 (2 m k +
        // k^2 = 2^28 elements), in 64-tiles (522240 tasks).
        assert!(check("gemm", &gemm(130560, 1024, 1024, 64)).is_ok());
        let e = check("gemm", &gemm(130624, 1024, 1024, 64)).unwrap_err();
        let bytes = 4 * (2 * 130624 * 1024 + 1024 * 1024u64);
        assert_eq!(
            e.to_string(),
            format!(
                "m = 130624, n = 1024, k = 1024, tile = 64 need {bytes} bytes of tensors; \
                 a built-in workload may take at most 1073741824 (1 GiB)"
            )
        );
        // Workload::build refuses them the same way, before building.
        let e = Workload::build("gemm", gemm(130624, 1024, 1024, 64))
            .err()
            .unwrap();
        assert!(matches!(e, WorkloadError::TooLarge { .. }), "{e}");
    }

    /// Sizes a builder refuses itself keep its message; sizes each
    /// workload reads past what a host can build are refused with the
    /// bound, the decode workloads' before their lengths are listed.
    #[test]
    fn each_workload_is_bounded_in_the_sizes_it_reads() {
        let p = |name: &str, m, n, k, tile| Params {
            m,
            n,
            k,
            tile,
            ..Params::of(name).unwrap()
        };
        let huge = u32::MAX;
        for (name, sizes) in [
            ("gemm", p("gemm", 1 << 16, 1 << 16, 64, 64)),
            ("mlp", p("mlp", huge - 63, 1024, 64, 64)),
            ("mlp-scratch", p("mlp", 64, 1024, huge - 63, 64)),
            ("streams", p("streams", 1 << 20, 64, 1 << 20, 64)),
            ("pipeline", p("pipeline", huge - 63, 64, 64, 64)),
            (
                "attention-pipeline",
                p("attention-pipeline", 16, huge - 63, 64, 64),
            ),
            ("decode", p("decode", 65536, 8192, 128, 16)),
            ("decode", p("decode", huge, 8192, 128, 16)),
            ("decode-uniform", p("decode", 32, 1 << 24, 128, 16)),
            ("decode-skew", p("decode", 32, 8192, 128, 1 << 24)),
            ("decode-device", p("decode", 1 << 17, 8192, 128, 16)),
            ("sparse-decode", p("sparse-decode", huge, 16384, 128, 64)),
            ("sparse-decode", p("sparse-decode", 8, 16384, 128, 1 << 24)),
            // ffn = MAX_FFN: 3 x 64 experts x 128 x 2^15 x 4 bytes = 3 GiB.
            ("moe-layer", p("moe-layer", 256, 1 << 15, 128, 16)),
            ("moe-layer-var", p("moe-layer", 4096, 4096, 1024, 16)),
            ("decode-layer", p("decode-layer", 16, 1 << 24, 512, 16)),
            // Pages of 65536 tokens, the device planner's largest.
            (
                "decode-layer-dense",
                p("decode-layer", 16, 2048, 512, 1 << 16),
            ),
            ("stitched", p("stitched", 24, 128, 512, 1 << 16)),
        ] {
            let e = Workload::build(name, sizes).err().unwrap();
            assert!(
                matches!(e, WorkloadError::TooLarge { .. }),
                "{name} {sizes:?}: {e}"
            );
        }
        // The builders' own refusals, not the bounds.
        for (name, sizes, says) in [
            ("gemm", p("gemm", 256, 256, 256, 0), "tile 0"),
            (
                "decode",
                p("decode", 32, 8192, 4096, 16),
                "head dimension 4096",
            ),
            ("moe", p("moe", 100_000, 64, 64, 32), "m (tokens) = 100000"),
            (
                "moe-layer",
                p("moe-layer", 256, 1 << 20, 128, 16),
                "ffn = 1048576 must be in 1..=64 or a multiple of 64 up to 32768",
            ),
            (
                "decode-layer",
                p("decode-layer", huge, 2048, 512, 16),
                "the layer takes",
            ),
            (
                "sparse-decode",
                p("sparse-decode", 8, 16385, 128, 64),
                "request 0",
            ),
            (
                "decode-layer-dense",
                p("decode-layer", 16, 2048, 512, 1 << 24),
                "16777216 tokens per page",
            ),
            (
                "stitched",
                p("stitched", 24, 128, 512, 1 << 24),
                "16777216 tokens per page",
            ),
        ] {
            let e = Workload::build(name, sizes).err().unwrap();
            assert!(e.to_string().contains(says), "{name}: {e}");
        }
    }
}
