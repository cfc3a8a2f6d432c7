//! The host planner: splits each (request, KV head) into chunks of KV
//! tokens from host-side metadata only (lengths, head counts, core count).
//!
//! # The chunk rule
//!
//! A work item is (request, KV head, chunk); its estimated cost is
//! `item + token * tokens` cycles ([`CostModel`], from the kernel's cost
//! formula). For a chunk size `c`, let `total(c)` be the cost of all items
//! and `largest(c)` the cost of the largest item (`min(c, max len)`
//! tokens). The planner picks the **largest** `c` that is a multiple of
//! the page size `P`, at least [`min_chunk`]`(P)` = `max(P, 128 rounded
//! up to P)` and at most the longest length rounded up to `P`, such that
//!
//! ```text
//! WAVES * largest(c) * cores <= total(c)        (WAVES = 8)
//! ```
//!
//! that is: each core's even share of the work holds at least `WAVES`
//! whole waves of the largest item. `largest` grows with `c` and `total`
//! shrinks with it, so the condition holds for every `c` up to some size
//! and for none above: a binary search over the multiples of `P` finds
//! it. If no allowed `c` satisfies it (the work is too small for the
//! cores), `c` is the smallest allowed. If the longest length satisfies it
//! (many equal requests, e.g. `B * kv_heads >= WAVES * cores` at one
//! length), no request is split: FlashInfer's no-split case.
//!
//! Why it works: list scheduling (longest items first) ends within
//! `total / cores + largest` of the start (Graham), at most
//! `(1 + 1/WAVES) * total(c) / cores`, and the smallest chunk the rule
//! picks keeps `total(c)` within the fixed cost per item of the least
//! work. A request of `len <= c` tokens is not split; a longer one is
//! split into `ceil(len / c)` chunks starting at multiples of `c` (so on
//! page boundaries), all `c` tokens but the last.
//!
//! The items are listed longest first (ties in (request, KV head, chunk)
//! order), which is the order the table issues them in.

use std::num::NonZeroU32;

use super::kv::DecodeShape;
use super::reference::KERNEL_BLOCK;

/// Each core's share of the work holds at least this many of the largest
/// item (see the module doc).
pub const WAVES: u64 = 8;
/// The smallest chunk the planner picks, before rounding up to a page.
pub const MIN_CHUNK: u32 = 128;

/// The smallest chunk for page size `page`: `max(page, MIN_CHUNK rounded
/// up to a multiple of page)`. A page holds at least one token (a size of
/// 0 is refused where it is read, e.g. [`DecodeShape::check`]), so the
/// chunk is never 0 and dividing by it cannot fail.
pub fn min_chunk(page: NonZeroU32) -> NonZeroU32 {
    // MIN_CHUNK rounded up to whole pages is positive, and `page` itself
    // once `page >= MIN_CHUNK`: it cannot pass u32::MAX, and it is already
    // at least `page`.
    NonZeroU32::new(MIN_CHUNK.next_multiple_of(page.get())).unwrap_or(page)
}

/// Estimated cycles of one `attn_decode_partial` item: `item + token * n`
/// for `n` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostModel {
    /// Cycles an item costs whatever its length.
    pub item: u64,
    /// Cycles per token.
    pub token: u64,
}

impl CostModel {
    /// The kernel's cost formula for `g` query rows of dimension `d`:
    /// `4GD + 4G` per item; `2D + 2GD + 6G` per token plus a block's
    /// `GD + 6G` per [`KERNEL_BLOCK`] tokens, rounded up. Sizes whose
    /// cost does not fit `u64` cycles are refused.
    pub fn of(g: u32, d: u32) -> Result<CostModel, String> {
        let (g, d) = (g as u128, d as u128);
        let item = 4 * g * d + 4 * g;
        let token = 2 * d + 2 * g * d + 6 * g + (g * d + 6 * g).div_ceil(KERNEL_BLOCK as u128);
        match (u64::try_from(item), u64::try_from(token)) {
            (Ok(item), Ok(token)) => Ok(CostModel { item, token }),
            _ => Err(format!(
                "the cost of an item of {g} query rows of dimension {d} overflows 64-bit cycles"
            )),
        }
    }

    /// The estimated cost of an item of `tokens` tokens, `u64::MAX` when
    /// it passes 64 bits (only for hand-set fields: [`CostModel::of`]'s
    /// costs times a `u32` token count stay below 2^96, but `item` and
    /// `token` are public).
    ///
    /// Saturating rather than an error: the cost is an estimate, used to
    /// compare and order items, and saturation keeps it monotone in
    /// `tokens` and never below the exact cost's `min(exact, u64::MAX)`,
    /// so every comparison a caller can make stays right up to the cap; a
    /// `Result` would burden every caller for a case no kernel reaches
    /// (2^64 cycles), and the planner's own sums ([`choose_chunk`]) are
    /// already exact in 128 bits and refuse overflow there.
    pub fn cost(&self, tokens: u32) -> u64 {
        self.item
            .saturating_add(self.token.saturating_mul(tokens as u64))
    }
}

/// How a run splits the KV tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// One item per (request, KV head): no split, no merge.
    Unsplit,
    /// Chunks of this many tokens (at least 1; any size works, the
    /// planner's are multiples of the page size). A chunk of 0 gives a
    /// plan that [`Plan::check`] refuses.
    Fixed(u32),
    /// The planner's chunk for this many cores that run partials.
    Planned {
        /// Cube cores (`attn_decode_partial` runs on cube cores), at least
        /// 1 ([`Plan::new`] refuses 0).
        cores: u32,
    },
}

/// The chunk size of the planner's rule (see the module doc) for these
/// lengths, `kv_heads`, `cores` and page size. Refused: a page size of 0,
/// 0 cores, a longest length whose whole pages pass `u32::MAX` tokens,
/// and costs whose sums overflow 128 bits.
pub fn choose_chunk(
    lengths: &[u32],
    kv_heads: u32,
    cores: u32,
    page: u32,
    cost: CostModel,
) -> Result<u32, String> {
    let Some(page_nz) = NonZeroU32::new(page) else {
        return Err("page size 0".into());
    };
    if cores == 0 {
        return Err("0 cores to plan for (at least 1)".into());
    }
    let longest = lengths.iter().copied().max().unwrap_or(1).max(1);
    let lo_chunk = min_chunk(page_nz).get();
    let hi_chunk = longest
        .checked_next_multiple_of(page)
        .ok_or_else(|| {
            format!("the longest length {longest} in whole pages of {page} passes u32::MAX tokens")
        })?
        .max(lo_chunk);
    let overflow = || format!("the cost of the work overflows 128 bits ({cost:?})");
    let tokens: u128 = lengths.iter().map(|&l| l as u128).sum();
    let fits = |c: u32| -> Result<bool, String> {
        let items: u128 = lengths.iter().map(|&l| l.div_ceil(c) as u128).sum();
        let total = items
            .checked_mul(cost.item as u128)
            .and_then(|i| i.checked_add(tokens.checked_mul(cost.token as u128)?))
            .and_then(|w| w.checked_mul(kv_heads as u128))
            .ok_or_else(overflow)?;
        let largest = cost.item as u128 + cost.token as u128 * c.min(longest) as u128;
        let most = (WAVES as u128 * cores as u128)
            .checked_mul(largest)
            .ok_or_else(overflow)?;
        Ok(most <= total)
    };
    if fits(hi_chunk)? {
        return Ok(hi_chunk);
    }
    if !fits(lo_chunk)? {
        return Ok(lo_chunk);
    }
    // Invariant: fits(lo * page), !fits(hi * page).
    let (mut lo, mut hi) = (lo_chunk / page_nz, hi_chunk / page_nz);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid * page)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo * page)
}

/// One `attn_decode_partial` task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    /// The request.
    pub request: u32,
    /// The KV head.
    pub kv_head: u32,
    /// The chunk's index within its (request, KV head).
    pub chunk: u32,
    /// Its first token.
    pub first: u32,
    /// Its tokens (>= 1).
    pub count: u32,
}

/// One (request, KV head) and where its state goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// The request.
    pub request: u32,
    /// The KV head.
    pub kv_head: u32,
    /// Its chunks (1: written straight to `out`, no merge).
    pub chunks: u32,
    /// With more than one chunk: the first row of its `chunks * G` rows of
    /// partial states in `parts` (64-bit: the rows of a plan of many
    /// chunks may pass `u32`, which the table refuses).
    pub parts_row: Option<u64>,
}

/// The work list of one batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The chunk size (`u32::MAX`: no split).
    pub chunk: u32,
    /// Partial items, longest first (the table's order).
    pub items: Vec<Item>,
    /// Every (request, KV head), in (request, KV head) order.
    pub groups: Vec<Group>,
    /// Rows of `parts` the split groups use (`G` per chunk), exact
    /// (64-bit, as [`Group::parts_row`]).
    pub parts_rows: u64,
}

impl Plan {
    /// The plan of `strategy` for `shape`. A shape [`DecodeShape::check`]
    /// refuses, and a planned strategy [`choose_chunk`] refuses (e.g. for
    /// 0 cores), are refused.
    pub fn new(shape: &DecodeShape, strategy: Strategy) -> Result<Plan, String> {
        shape.check().map_err(|e| e.to_string())?;
        let chunk = match strategy {
            Strategy::Unsplit => u32::MAX,
            Strategy::Fixed(c) => c,
            Strategy::Planned { cores } => choose_chunk(
                &shape.lengths,
                shape.kv_heads,
                cores,
                shape.page,
                CostModel::of(shape.group(), shape.d)?,
            )?,
        };
        Ok(Plan::with_chunk(shape, chunk))
    }

    /// The plan that splits every (request, KV head) into chunks of
    /// `chunk` tokens (>= 1; 0 gives an empty plan, which
    /// [`Plan::check`] refuses). The shape is not checked: one of 0 KV
    /// heads has no groups, so an empty plan, which [`Plan::check`]
    /// refuses with the shape.
    pub fn with_chunk(shape: &DecodeShape, chunk: u32) -> Plan {
        let g = shape.q_heads.checked_div(shape.kv_heads).unwrap_or(0);
        let (mut items, mut groups, mut parts_rows) = (Vec::new(), Vec::new(), 0u64);
        if chunk == 0 {
            return Plan {
                chunk,
                items,
                groups,
                parts_rows,
            };
        }
        for (b, &len) in shape.lengths.iter().enumerate() {
            let chunks = len.div_ceil(chunk);
            for h in 0..shape.kv_heads {
                // chunks x G < 2^64. With G <= 16 (a checked shape) the sum
                // is at most 16 x the items listed, far below 2^64; an
                // unchecked G may pass it, and the sum then stops at
                // u64::MAX, which no table holds (decode_table refuses more
                // than u32::MAX rows).
                let parts_row = (chunks > 1).then(|| {
                    let row = parts_rows;
                    parts_rows = parts_rows.saturating_add(chunks as u64 * g as u64);
                    row
                });
                groups.push(Group {
                    request: b as u32,
                    kv_head: h,
                    chunks,
                    parts_row,
                });
                for i in 0..chunks {
                    // i < ceil(len / chunk), so i x chunk < len.
                    let first = i * chunk;
                    items.push(Item {
                        request: b as u32,
                        kv_head: h,
                        chunk: i,
                        first,
                        count: chunk.min(len - first),
                    });
                }
            }
        }
        // Longest first; the sort is stable, so ties keep (request, head, chunk) order.
        items.sort_by_key(|it| std::cmp::Reverse(it.count));
        Plan {
            chunk,
            items,
            groups,
            parts_rows,
        }
    }

    /// Checks that this is a plan of `shape`: its groups and `parts` rows
    /// are those of [`Plan::with_chunk`] with its chunk, and its items are
    /// that plan's, in any order. A plan made for other lengths or heads
    /// (or edited) would attend to other tokens than the data's, or leave
    /// outputs unwritten. A shape [`DecodeShape::check`] refuses is
    /// refused.
    pub fn check(&self, shape: &DecodeShape) -> Result<(), String> {
        shape.check().map_err(|e| e.to_string())?;
        if self.chunk == 0 {
            return Err("the plan has chunks of 0 tokens".into());
        }
        let want = Plan::with_chunk(shape, self.chunk);
        if self.groups.len() != want.groups.len() {
            return Err(format!(
                "the plan has {} (request, KV head) groups; the shape has {} ({} requests x {} KV heads)",
                self.groups.len(),
                want.groups.len(),
                shape.batch(),
                shape.kv_heads
            ));
        }
        let mismatch = |request: u32, kv_head: u32, what: &str| {
            let len = shape.lengths[request as usize];
            format!(
                "request {request}, KV head {kv_head}: the plan's {what} not those of its \
                 {len} KV tokens in chunks of {} (was the plan made for other lengths?)",
                self.chunk
            )
        };
        if let Some(w) = self.groups.iter().zip(&want.groups).find(|(g, w)| g != w) {
            return Err(mismatch(
                w.1.request,
                w.1.kv_head,
                "chunks and parts rows are",
            ));
        }
        if self.parts_rows != want.parts_rows {
            return Err(format!(
                "the plan has {} rows of partial states; its groups use {}",
                self.parts_rows, want.parts_rows
            ));
        }
        let key = |it: &Item| (it.request, it.kv_head, it.chunk);
        let mut items = self.items.clone();
        items.sort_by_key(key);
        let mut wanted = want.items;
        wanted.sort_by_key(key);
        if items.len() != wanted.len() {
            return Err(format!(
                "the plan has {} items; its groups have {} chunks",
                items.len(),
                wanted.len()
            ));
        }
        if let Some((_, w)) = items.iter().zip(&wanted).find(|(i, w)| i != w) {
            return Err(mismatch(w.request, w.kv_head, "items are"));
        }
        Ok(())
    }

    /// Groups split into more than one chunk (one merge each).
    pub fn merges(&self) -> usize {
        self.groups.iter().filter(|g| g.chunks > 1).count()
    }
}
