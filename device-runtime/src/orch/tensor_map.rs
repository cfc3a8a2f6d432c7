//! The TensorMap: which live tasks read or write which regions of which
//! tensors, so that a new task finds the earlier tasks it must wait for.
//!
//! A new argument that reads a region depends on every live earlier writer
//! of an overlapping region (read-after-write). One that writes depends on
//! every live earlier writer (write-after-write) **and reader**
//! (write-after-read) of an overlapping region. Overlap is the exact
//! hyper-rectangle test of [`Region::overlaps`].
//!
//! Entries are allocated from a ring in submission order and reclaimed in
//! retirement order (tasks retire oldest first), so allocation is a bump and
//! reclamation moves one index: there is no free list and no per-task list.
//! Entries are addressed by *position*, a counter that only grows (the slot
//! is `position % N`), and each bucket chain links from newer positions to
//! older ones. A link to a position below the reclaimed tail therefore ends
//! the chain: everything behind it is older and reclaimed too. This is the
//! reference runtime's lazy invalidation, without its need to size the pool
//! so that entries never wrap while referenced: the position check makes a
//! stale link harmless.
//!
//! Two things keep chains short, so lookups stay cheap: a scan unlinks the
//! entries of completed tasks it meets (a dependency on a finished task is
//! already met), and a new write unlinks the older entries whose region it
//! fully covers (later tasks reach those through the new writer, which
//! waits for them): at once when its scan commits, or, after a counting
//! scan, by marking them for the next scan to unlink. Unlinking shortens
//! chains; the ring space comes back when the task retires.
//!
//! A scan of more than one bucket also stops at the first live writer of
//! all of its region that it meets: every older access that conflicts with
//! the region conflicts with that write too, so it was ordered before it
//! (and any older entry the region covers, that write covered and
//! unlinked). Reads of a whole tensor never cover each other and stay
//! linked while live; a tile's write between them then visits the reads
//! since its tile's last write only. To meet that writer early, a scan
//! walks the writers' chain of a bucket before the readers', and a tile's
//! own cell before the wide bucket.
//!
//! Entries are found by place, not only by tensor. A tensor's elements are
//! split into cells, boxes whose extent is a power of two in every
//! dimension, and an entry goes to the bucket of its tensor and of the cell
//! holding its first element. The cells are sized to the tensor's tiles:
//! the first region placed on a tensor fixes its cell shape (per
//! dimension, the power of two at or above the region's extent), and
//! [`REFIT`] regions in a row that would fit another shape refit it to the
//! last of them. A region of another size among the tiles (a whole tensor
//! read or written between rounds of tiles) does not, so it cannot gather
//! the tiles after it in one cell. Entries placed with the previous shape
//! stay where they are; while one may be live, lookups probe its cells too
//! (a refit waits until none is). So the writes of many independent
//! tiles of one tensor (a GEMM's output, a MoE layer's rows) sit in
//! separate chains: an aligned tile probes one bucket, and meets only the
//! entries of its own tile. Shapes are kept per slot of [`SHAPES`]
//! (tensor `t` uses slot `t % SHAPES`); tensors that share a slot share a
//! shape, which costs time only.
//!
//! Most tiles of a tiled workload are *exactly* one cell: aligned to the
//! cell grid, with the cell's extent. Placing one then takes a few bitwise
//! operations, and two exact entries of a tensor overlap iff they name the
//! same cell, in which case each covers the other: a lookup compares their
//! offsets instead of computing the overlap of two boxes. Likewise a region
//! made of whole cells (a block of tiles, a whole tensor of them) holds
//! every cell it probes: an exact entry of the probed cell is inside it.
//! The other way round, an entry of whole cells (more than one) is flagged
//! when placed, and an exact tile's lookup that meets it tests only
//! whether the tile's first element is inside it: the tile is inside it or
//! apart from it, and never holds all of it.
//!
//! A region larger than its tensor's cell in some dimension is *wide*: it
//! goes to its tensor's wide bucket. A lookup probes the cells its region
//! touches, plus, in every dimension, the cell before them if a live entry
//! of the slot reaches over its origin cell's boundary (tiles aligned to
//! their size never do), plus the wide bucket if a wide entry of the slot
//! is live. A lookup that would probe more than [`MAX_PROBES`] cells (a
//! region much larger than the tiles) scans every bucket instead: always
//! correct, and rare. Two cells may share a bucket; a bucket scanned twice
//! costs time only (the caller counts each producer once).
//!
//! Sizing: a task uses one entry (48 bytes) per tensor argument until it
//! retires, so `N >= task window x arguments per task` means the TensorMap
//! never stalls on its own.

use crate::abi::{Region, MAX_RANK};

/// Buckets of the TensorMap (a power of two); entries hash by tensor and
/// cell. 16 bytes each (two chain heads). 2,048 for table runs' 8,192
/// entries: a tile's scan meets the entries of other cells that share its
/// bucket, 1.2 per task on the scheduling bench's independent tasks (a
/// full 4,096-task window of one-entry tasks) against 3.3 with 1,024
/// buckets, which cost about 100 instructions per task.
pub const BUCKETS: usize = 2048;

/// Cell-shape slots (a power of two, at most 256): tensor `t` uses slot
/// `t % SHAPES`.
pub const SHAPES: usize = 256;
const _: () = assert!(SHAPES.is_power_of_two() && SHAPES <= 256);

/// Most cells one lookup probes before it scans every bucket instead (a
/// probe costs a hash and two chain heads; a scan of every bucket costs
/// `2 x BUCKETS` chain heads): a whole 16 x 16 tensor of one-element tiles
/// probes its 256 cells.
pub const MAX_PROBES: u64 = 256;

/// The cell coordinates of a wide entry's bucket. Not all ones: [`bucket`]
/// folds the two halves of the coordinates onto each other, and all ones
/// would cancel to cell 0's bucket.
const WIDE: [u32; MAX_RANK] = [u32::MAX, u32::MAX, u32::MAX, 0];

/// Bucket index bits: the top bits of the hash.
const BUCKET_SHIFT: u32 = 64 - BUCKETS.trailing_zeros();

/// Covered entries a scan remembers for the commit (more: the commit
/// rescans). A write of a whole tensor of [`MAX_PROBES`] one-tile cells
/// covers an entry per cell and the tensor's last whole write (the
/// scheduling bench's fan-in task: 257), so such a submission, when its
/// edges had to be counted first, commits without a second scan (one
/// thread, that graph: 2,997 -> 2,703 instructions per task). 8 bytes each.
const PENDING: usize = MAX_PROBES as usize + 16;

/// Regions in a row that fit another cell shape than their slot's before
/// the slot is refitted to the last of them. More than one, so that an
/// occasional region of another size (a whole tensor among its tiles)
/// does not refit the cells of the tiles around it.
pub const REFIT: u32 = 4;

/// "No entry": positions start at 1, and the tail never falls below 1.
const NONE: u64 = 0;

/// One access: 48 bytes (the region 32, the tensor, the low half of the
/// task's number, and the chain link with two flags), one per tensor
/// argument of every task in the window.
#[derive(Clone, Copy, Debug)]
struct Entry {
    tensor: u32,
    /// The low 32 bits of the task's number: the task is within the window
    /// of the newest task that placed an entry ([`TensorMap::newest_task`]),
    /// which restores the rest ([`TensorMap::task_of`]).
    task: u32,
    /// Position of the next (older) entry of the bucket chain (below
    /// [`WHOLE`]), with the flags [`COVERED`], [`EXACT`] and [`WHOLE`].
    link: u64,
    region: Region,
}
const _: () = assert!(core::mem::size_of::<Entry>() == 48);

/// [`Entry::link`] flag: a newer write covers this entry's region: skip it
/// and unlink it.
const COVERED: u64 = 1 << 63;
/// [`Entry::link`] flag: the region is exactly one cell ([`Place::exact`]).
const EXACT: u64 = 1 << 62;
/// [`Entry::link`] flag: the region is made of whole cells, more than one
/// ([`Place::whole`]).
const WHOLE: u64 = 1 << 61;
/// [`Entry::link`]'s position bits. Positions grow by one per entry, so
/// they stay below 2^61 (over 70 years at a billion entries a second).
const POSITION: u64 = WHOLE - 1;

const EMPTY: Entry = Entry {
    tensor: 0,
    task: 0,
    link: NONE,
    region: Region {
        offset: [0; MAX_RANK],
        extent: [0; MAX_RANK],
    },
};

/// The cell shape of a slot's tensors, and which kinds of entries placed
/// with it may still be live.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Per dimension, the bits of an element index above the cell's
    /// extent (a power of two): an element's cell is its index AND this.
    mask: [u32; MAX_RANK],
    /// Per dimension, the cell's extent (`!mask + 1`).
    size: [u32; MAX_RANK],
    /// The head when a submission last placed an argument with this shape:
    /// its entries, if it commits, are there or after. Below the tail, no
    /// entry uses the shape, and the next region fits it anew.
    newest: u64,
    /// Position of the newest entry that reaches over its origin cell's
    /// boundary. Below the tail, no live entry does, and lookups need not
    /// probe back a cell.
    crossing: u64,
    /// Position of the newest wide entry. Below the tail, lookups need not
    /// probe the wide bucket.
    wide: u64,
    /// The later of `crossing`, `wide` and `prev_end - 1`: below the tail,
    /// a region inside one cell is [`Place::SIMPLE`].
    odd: u64,
    /// The cell masks before the last refit that left entries live.
    prev_mask: [u32; MAX_RANK],
    /// Entries before this position may have been placed with `prev_mask`
    /// (none of them reaching over its origin cell's boundary). Above the
    /// tail, lookups probe the cells of `prev_mask` too.
    prev_end: u64,
    /// Regions placed in a row that would fit another shape ([`REFIT`]).
    misfits: u32,
}

const UNUSED: Shape = Shape {
    mask: [u32::MAX; MAX_RANK],
    size: [1; MAX_RANK],
    newest: NONE,
    crossing: NONE,
    wide: NONE,
    odd: NONE,
    prev_mask: [u32::MAX; MAX_RANK],
    prev_end: NONE,
    misfits: 0,
};

/// A slot's cell for the exactness test of [`TensorMap::place`], in
/// 64-bit words: the bits inside a cell (`!mask`) and the cell's extent,
/// every dimension of each in two words. Kept apart from the [`Shape`]
/// (32 bytes a slot, a shift to index) and tested word by word in
/// general-purpose registers: on the benches, 6 to 8 fewer instructions
/// an argument than the 128-bit test of the shape's fields.
#[derive(Clone, Copy, Debug)]
struct Fit {
    inner: [u64; 2],
    size: [u64; 2],
}

impl Fit {
    const fn of(shape: &Shape) -> Fit {
        let m = shape.mask;
        let z = shape.size;
        Fit {
            inner: [
                !(m[0] as u64 | (m[1] as u64) << 32),
                !(m[2] as u64 | (m[3] as u64) << 32),
            ],
            size: [
                z[0] as u64 | (z[1] as u64) << 32,
                z[2] as u64 | (z[3] as u64) << 32,
            ],
        }
    }

    /// Whether a region of `offset` and `extent` (as [`words`]) is exactly
    /// one cell: no offset bits inside a cell, and the cell's extent.
    #[inline(always)]
    fn exact(&self, offset: [u64; 2], extent: [u64; 2]) -> bool {
        (offset[0] & self.inner[0]
            | offset[1] & self.inner[1]
            | extent[0] ^ self.size[0]
            | extent[1] ^ self.size[1])
            == 0
    }
}

/// Every dimension of `a` in two 64-bit words (dimensions 0 and 1, then
/// 2 and 3), as [`word`]'s halves.
#[inline(always)]
fn words(a: [u32; MAX_RANK]) -> [u64; 2] {
    zerocopy::transmute!(a)
}

/// The cell masks for tiles of `extent` elements: per dimension, the bits
/// above the smallest power of two at or above the extent (all bits for an
/// extent of 1; only the top bit for 0 and for extents over 2^31, so that a
/// cell never holds more than 2^31 elements).
#[inline(always)]
fn fit(extent: [u32; MAX_RANK]) -> [u32; MAX_RANK] {
    // Smears the highest set bit of `extent - 1` down (shifts by constants,
    // so that it compiles to vector ops): the bits below the power of two.
    let mut below = extent.map(|e| e.wrapping_sub(1));
    for s in [1, 2, 4, 8, 16] {
        below = core::array::from_fn(|d| below[d] | below[d] >> s);
    }
    below.map(|b| !b | 1 << 31)
}

/// What a scan asks its caller about the tasks of the entries it meets.
pub trait Visitor {
    /// Whether `task` has not completed; the entries of one that has are
    /// unlinked without looking at their regions.
    fn live(&self, task: u64) -> bool;
    /// A live `task` has an access that conflicts with the scanned one.
    fn conflict(&mut self, task: u64);
    /// [`Visitor::conflict`] with a write of `task`'s (the scanned access
    /// then reads or writes).
    fn writer_conflict(&mut self, task: u64) {
        self.conflict(task)
    }
    /// A scanned write met a live `task` that reads all of its region
    /// (reported before its [`Visitor::conflict`]): every live writer
    /// older than that task whose write conflicts with the scanned one
    /// conflicts with its read too, so it was ordered before it, and the
    /// scanned write waits for the reader. The scan itself leaves out the
    /// writers it meets after the reader; a visitor that holds conflicts
    /// may leave out those it met before.
    fn covering_reader(&mut self, _task: u64) {}
    /// A live `task` writes all of the scanned region (reported before its
    /// [`Visitor::conflict`]): every live task before it whose access
    /// conflicts with the scanned one conflicts with its write too, so it
    /// was ordered before it when it was submitted. A scan of more than
    /// one bucket visits no entry older than it from then on, but may have
    /// reported some in the chains it walked before (chains are not ordered
    /// across each other); a visitor that records edges may leave those out
    /// (they are implied).
    fn cut(&mut self, _task: u64) {}
}

/// `N` entries in a ring.
pub struct TensorMap<const N: usize> {
    entries: [Entry; N],
    /// Per bucket: the newest reader entry and the newest writer entry.
    buckets: [[u64; 2]; BUCKETS],
    /// Cell shapes, per slot of tensors.
    shapes: [Shape; SHAPES],
    /// Per slot, its shape's cell as [`place`](TensorMap::place)'s
    /// exactness test reads it (a copy of `mask` and `size`).
    fits: [Fit; SHAPES],
    /// Position the next entry gets.
    head: u64,
    /// Oldest position not reclaimed.
    tail: u64,
    /// Positions of entries the current submission's writes cover (the first
    /// [`PENDING`]), marked when it commits.
    pending: [u64; PENDING],
    /// How many covered entries the scans since [`TensorMap::begin`] found.
    pending_len: usize,
    /// The task of the newest entry. Entries not reclaimed belong to tasks
    /// not retired, all within the window (far less than 2^32) before it.
    newest_task: u64,
}

/// Multiplicative hash of a tensor and a cell. The key packs the tensor
/// and the cell coordinates into one word at spread-out rotations (cell
/// coordinates are small, so they rarely collide there), and one multiply
/// mixes it; a collision costs time only.
#[inline(always)]
fn bucket(tensor: u32, cell: [u32; MAX_RANK]) -> usize {
    bucket_of_word(tensor, word(cell))
}

/// [`bucket`] of a cell given as a [`word`].
#[inline(always)]
fn bucket_of_word(tensor: u32, cell: u128) -> usize {
    bucket_of_words(tensor, [cell as u64, (cell >> 64) as u64])
}

/// [`bucket`] of a cell given as [`words`].
#[inline(always)]
fn bucket_of_words(tensor: u32, [low, high]: [u64; 2]) -> usize {
    let key = (tensor as u64).rotate_left(48) ^ low ^ high.rotate_left(16);
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> BUCKET_SHIFT) as usize
}

/// Every dimension of `a` in one integer, for bitwise operations on all
/// of them at once (where the compiler would load and combine them one
/// by one).
#[inline(always)]
fn word(a: [u32; MAX_RANK]) -> u128 {
    zerocopy::transmute!(a)
}

/// Cells of one lookup: the first and last cell of a box, and the cell mask.
type Cells = ([u32; MAX_RANK], [u32; MAX_RANK], [u32; MAX_RANK]);

/// The next cell of the box `lo..=hi` of cells of `mask`, odometer style;
/// `false` after the last.
#[inline(always)]
fn next_cell(cell: &mut [u32; MAX_RANK], (lo, hi, mask): &Cells) -> bool {
    for d in 0..MAX_RANK {
        if cell[d] < hi[d] {
            cell[d] += !mask[d] + 1;
            return true;
        }
        cell[d] = lo[d];
    }
    false
}

/// The box of cells of `mask` where an entry overlapping `region` can have
/// its origin (from a cell before, in every dimension, if `back`), or
/// `None` if it holds more than [`MAX_PROBES`] cells.
#[inline(always)]
fn cells_of(mask: [u32; MAX_RANK], back: bool, region: &Region) -> Option<Cells> {
    // A narrow entry spans at most two cells per dimension: its origin's
    // and the next.
    let (mut lo, mut hi) = ([0u32; MAX_RANK], [0u32; MAX_RANK]);
    let mut count = 1u64;
    for d in 0..MAX_RANK {
        let (first, step) = (region.offset[d], !mask[d] + 1);
        let last = first.saturating_add(region.extent[d].max(1) - 1);
        lo[d] = first & mask[d];
        if back {
            lo[d] = lo[d].saturating_sub(step);
        }
        hi[d] = last & mask[d];
        // A cell has at most 2^31 elements, so `step` is not 0.
        count = count.saturating_mul(((hi[d] - lo[d]) / step) as u64 + 1);
    }
    (count <= MAX_PROBES).then_some((lo, hi, mask))
}

/// Where one argument's entry goes and what its lookup probes, computed
/// once per submission by [`TensorMap::place`] (for the counting scan, the
/// committing scan and the insert).
///
/// One word, so that a place is built, stored and tested in a register:
/// bits 0..15 are the bucket of the entry (its tensor's and origin cell's,
/// or its tensor's wide bucket), bit 15 whether the region is whole cells
/// (`Place::whole`), bits 16..24 its tensor's cell-shape slot,
/// bits 24..32 what the region is and what its lookup must probe
/// (`SIMPLE` and the other flags below, one bit each). Bucket and slot
/// numbers are below [`BUCKETS`] and [`SHAPES`]; indexing with `% BUCKETS`
/// and `% SHAPES` tells the compiler so, which drops bounds checks from the
/// hot path.
#[derive(Clone, Copy, Debug, Default)]
pub struct Place(u32);

const _: () = assert!(BUCKETS <= 1 << 15, "a bucket number fits 15 bits");

/// [`Place`]'s bit for [`Place::whole`] (above the bucket number; the
/// flags byte is full).
const WHOLE_PLACE: u32 = 1 << 15;

impl Place {
    #[inline(always)]
    fn new(home: usize, slot: usize, flags: u8) -> Place {
        Place(home as u32 | (slot as u32) << 16 | (flags as u32) << 24)
    }

    /// The bucket of the entry.
    #[inline(always)]
    fn home(&self) -> usize {
        (self.0 & 0x7fff) as usize % BUCKETS
    }

    /// The region is wide and made of whole cells ([`whole_cells`]): an
    /// exact region of its tensor (one cell of the same shape) is inside it
    /// or apart from it, and never holds all of it.
    #[inline(always)]
    fn whole(&self) -> bool {
        self.0 & WHOLE_PLACE != 0
    }

    /// The cell-shape slot of its tensor.
    #[inline(always)]
    fn slot(&self) -> usize {
        (self.0 >> 16 & 0xff) as usize % SHAPES
    }

    /// The region lies inside its origin cell, and no wide or crossing
    /// entry of its slot is live: its lookup scans its home bucket only,
    /// and its entry changes nothing in the slot's shape (the common case,
    /// a tile).
    const SIMPLE: u8 = 1;
    /// The region is exactly its origin cell. Two exact regions of a tensor
    /// overlap iff they are the same cell (the live entries of a tensor were
    /// all placed with the same shape), and then each covers the other.
    const EXACT: u8 = 2;
    /// The region lies inside its origin cell.
    const ONE_CELL: u8 = 4;
    /// The region is larger than a cell in some dimension.
    const WIDE: u8 = 8;
    /// The region is narrow and reaches over its origin cell's boundary.
    const CROSSING: u8 = 16;
    /// A live entry of the slot reaches over its origin cell's boundary:
    /// lookups probe back a cell in every dimension.
    const BACK: u8 = 32;
    /// A wide entry of the slot is live: lookups probe the wide bucket.
    const WIDE_LIVE: u8 = 64;
    /// An entry placed with the slot's previous shape may be live: lookups
    /// probe its cells too, and compare boxes even of exact regions (an
    /// entry's exactness was of the shape it was placed with).
    const PREV: u8 = 128;

    /// Whether any of the flags `flags` is set.
    #[inline(always)]
    fn has(&self, flags: u8) -> bool {
        // A test of the word against the flags in place, not of the
        // extracted byte: one instruction where the byte costs a shift
        // and a mask per test.
        self.0 & (flags as u32) << 24 != 0
    }

    /// This place with the flags of [`TensorMap::place_exact`]'s places
    /// (`SIMPLE`, `EXACT`, `ONE_CELL`) as constants.
    #[inline(always)]
    pub fn exact_simple(&self) -> Place {
        let flags = Place::SIMPLE | Place::EXACT | Place::ONE_CELL;
        Place(self.0 & 0x00ff_ffff | (flags as u32) << 24)
    }

    /// A region inside its home cell (`ONE_CELL`), of the slot's current
    /// shape (no `PREV`), with no entry reaching back into the cell
    /// (no `BACK`), and some wide entry live (`WIDE_LIVE`): its scan is
    /// its home bucket then the wide bucket.
    pub(crate) fn tile_beside_wide(&self) -> bool {
        self.0 >> 24 & (Place::ONE_CELL | Place::BACK | Place::PREV | Place::WIDE_LIVE) as u32
            == (Place::ONE_CELL | Place::WIDE_LIVE) as u32
    }

    /// The region is exactly its origin cell (`EXACT`).
    pub fn exact(&self) -> bool {
        self.has(Place::EXACT)
    }

    /// Its lookup scans its home bucket only (`SIMPLE`): no wide entry is
    /// live and every live entry that covers part of the region was placed
    /// in the same cell, so a committing write has unlinked the older
    /// entries it covers and a scan finds no implied conflicts to leave
    /// out ([`Visitor::cut`]).
    pub fn simple(&self) -> bool {
        self.has(Place::SIMPLE)
    }
}

/// One argument's scan of the TensorMap ([`TensorMap::scan`]).
#[derive(Clone, Copy)]
struct Scan<'r> {
    tensor: u32,
    region: &'r Region,
    /// [`Place::exact`].
    exact: bool,
    writes: bool,
    /// Unlink covered entries at once (the submission is committing).
    mark_now: bool,
    /// Position of the newest live entry met that writes all of the
    /// region, or [`NONE`]: the scan skips the entries before it, since
    /// every earlier access that conflicts with the region conflicts with
    /// that write too, and so was ordered before it (and any it covers,
    /// this write covered too).
    bound: u64,
    /// The region holds all of the cell [`Scan::cell`] being probed, and
    /// every live entry of the tensor was placed with the current shape:
    /// an exact entry of that cell lies inside the region.
    whole: bool,
    /// The cell being probed (its first element, as a [`word`]).
    cell: u128,
    /// A write's scan: one more than the newest live task met that reads
    /// all of the region, or 0. A writer older than that task needs no
    /// edge: the reader's region holds the writer's conflict with this
    /// one, so the reader was ordered after the writer, and this write
    /// waits for the reader.
    reader: u64,
}

/// Whether `region` is made of whole cells of `mask` (its first element and
/// the one after its last are on cell boundaries in every dimension, and it
/// is not empty): every cell [`cells_of`] lists for it without `back` then
/// lies inside it. The end is taken modulo 2^32, which keeps the bits below
/// a cell's extent (at most 2^31).
#[inline(always)]
fn whole_cells(mask: [u32; MAX_RANK], region: &Region) -> bool {
    let end: [u32; MAX_RANK] =
        core::array::from_fn(|d| region.offset[d].wrapping_add(region.extent[d]));
    (word(region.offset) | word(end)) & !word(mask) == 0 && !region.extent.contains(&0)
}

/// Whether the element `at` lies in the non-empty `region`: per dimension,
/// `offset <= at < offset + extent`, as sign bits of i64 differences
/// (branch-free, as [`relation_dims`]).
#[inline(always)]
fn cell_inside(at: &[u32; MAX_RANK], region: &Region) -> bool {
    let mut outside = 0i64;
    for ((&a, &first), &extent) in at.iter().zip(&region.offset).zip(&region.extent) {
        let (a, first) = (a as i64, first as i64);
        outside |= (a - first) | (first + extent as i64 - 1 - a);
    }
    outside >= 0
}

/// Whether `new` and `old` overlap ([`Region::overlaps`]), and whether
/// `new` contains every element of `old` (and `old` every element of
/// `new`). Dimensions from [`LEAD`] on are most often the same non-empty
/// interval in both regions (beyond a rank-2 tensor's rank every region
/// is offset 0, extent 1): each such dimension holds all three relations,
/// and only the first `LEAD` are tested then. Out of line: it runs for
/// entries the fast paths of the scan do not settle (a tile against a wide
/// entry, or another cell's), and inlined in every scan it spills the
/// scan's state around itself (about 100 instructions a call against 60).
///
/// With `cell_in_whole`, `new` is exactly one cell and `old` whole cells
/// of the same shape, more than one ([`Place::whole`]): the cell is inside
/// them or apart from them, and never holds them all.
#[inline(never)]
fn relation(new: &Region, old: &Region, cell_in_whole: bool) -> (bool, bool, bool) {
    if cell_in_whole {
        let inside = cell_inside(&new.offset, old);
        return (inside, false, inside);
    }
    // Two 64-bit compares (a slice compare can become a call to `bcmp`).
    let tail = |r: &Region| {
        let pair = |a: [u32; MAX_RANK]| a[LEAD] as u64 | (a[LEAD + 1] as u64) << 32;
        (pair(r.offset), pair(r.extent))
    };
    let same_tail = tail(new) == tail(old) && new.extent[LEAD] != 0 && new.extent[LEAD + 1] != 0;
    if same_tail {
        relation_dims::<LEAD>(new, old)
    } else {
        relation_dims::<MAX_RANK>(new, old)
    }
}

/// Dimensions [`relation`] tests one by one when the others are the same
/// non-empty interval in both regions.
const LEAD: usize = 2;
const _: () = assert!(LEAD + 2 == MAX_RANK, "the tail is two dimensions");

/// [`relation`] over dimensions `0..DIMS`, in one branch-free pass. In i64
/// the ends (below 2^33) cannot overflow, and each test is the sign bit
/// of differences: `a < b` iff `a - b < 0`.
#[inline(always)]
fn relation_dims<const DIMS: usize>(new: &Region, old: &Region) -> (bool, bool, bool) {
    let (mut meet, mut inside, mut around) = (-1i64, 0i64, 0i64);
    for d in 0..DIMS {
        let (n0, o0) = (new.offset[d] as i64, old.offset[d] as i64);
        let (n1, o1) = (n0 + new.extent[d] as i64, o0 + old.extent[d] as i64);
        // Overlap: every `n0 < o1` and `o0 < n1`; cover: every `n0 <= o0`
        // and `o1 <= n1` (no difference below is negative); the old
        // region covers the new one the other way round.
        meet &= (n0 - o1) & (o0 - n1);
        inside |= (o0 - n0) | (n1 - o1);
        around |= (n0 - o0) | (o1 - n1);
    }
    (meet < 0, inside >= 0, around >= 0)
}

impl<const N: usize> TensorMap<N> {
    /// Positions run in blocks of `SPAN` (`N` rounded up to a power of two):
    /// a block's first `N` positions name the entries, in order, and the
    /// rest are skipped. An entry's index is then its position's low bits,
    /// with no division when `N` is not a power of two (table runs keep
    /// three entries per task of the window); when it is, nothing is skipped.
    const SPAN: u64 = (N as u64).next_power_of_two();

    /// An empty map.
    pub const fn new() -> Self {
        TensorMap {
            entries: [EMPTY; N],
            buckets: [[NONE; 2]; BUCKETS],
            shapes: [UNUSED; SHAPES],
            fits: [Fit::of(&UNUSED); SHAPES],
            head: 1,
            tail: 1,
            pending: [NONE; PENDING],
            pending_len: 0,
            newest_task: 0,
        }
    }

    /// Makes the map behave as [`TensorMap::new`] without rewriting its
    /// entries (48 bytes each): once the bucket chains are emptied, an
    /// entry is reached only after an insertion wrote it. For an
    /// orchestrator whose tasks have all retired and whose task numbers
    /// start again (an old entry's number would name a new task).
    pub fn recycle(&mut self) {
        let TensorMap {
            entries: _,
            buckets,
            shapes,
            fits,
            head,
            tail,
            pending: _,
            pending_len,
            newest_task,
        } = self;
        *buckets = [[NONE; 2]; BUCKETS];
        *shapes = [UNUSED; SHAPES];
        *fits = [Fit::of(&UNUSED); SHAPES];
        (*head, *tail) = (1, 1);
        *pending_len = 0;
        *newest_task = 0;
    }

    /// Where an argument on `region` of `tensor` goes. The first region
    /// placed on a slot fits its cell shape; after [`REFIT`] regions in a
    /// row that would fit another shape, the shape is refitted to the last
    /// of them (if no earlier refit's entries and no entry reaching over a
    /// cell boundary are live). Counted also when the submission stalls
    /// and inserts nothing.
    #[inline(always)]
    pub fn place(&mut self, tensor: u32, region: &Region) -> Place {
        let slot = tensor as usize % SHAPES;
        let offset = words(region.offset);
        let (head, tail) = (self.head, self.tail);
        // The common case, a tile that is exactly one cell (its offset has
        // no bits inside a cell and its extent is the cell's), most often
        // of a tensor with no wide, crossing or previous-shape entry live.
        if self.fits[slot].exact(offset, words(region.extent)) {
            let shape = &mut self.shapes[slot];
            // This submission's entries get positions from the head on, and
            // the tail passes the head only when all of them are reclaimed.
            shape.newest = head;
            shape.misfits = 0;
            let home = bucket_of_words(tensor, offset);
            let flag = |on: bool, flag: u8| on as u8 * flag;
            let flags = if shape.odd < tail {
                Place::SIMPLE
            } else {
                flag(shape.crossing >= tail, Place::BACK)
                    | flag(shape.wide >= tail, Place::WIDE_LIVE)
                    | flag(shape.prev_end > tail, Place::PREV)
            };
            return Place::new(home, slot, flags | Place::EXACT | Place::ONE_CELL);
        }
        self.refit(slot, region);
        self.place_in(slot, tensor, region)
    }

    /// [`TensorMap::place`] of the commonest region, a tile that is exactly
    /// one cell of a slot with no wide, crossing or previous-shape entry
    /// live: its place, [`Place::simple`] and [`Place::exact`] (as a
    /// constant, so that the caller's scan and insert fold the flags'
    /// tests away), with `place`'s bookkeeping. `None`, changing nothing,
    /// for any other region, which `place` then places.
    #[inline(always)]
    pub fn place_exact(&mut self, tensor: u32, region: &Region) -> Option<Place> {
        let slot = tensor as usize % SHAPES;
        let offset = words(region.offset);
        if !self.fits[slot].exact(offset, words(region.extent)) {
            return None;
        }
        let (head, tail) = (self.head, self.tail);
        let shape = &mut self.shapes[slot];
        if shape.odd >= tail {
            return None;
        }
        // As in `place`.
        shape.newest = head;
        shape.misfits = 0;
        let home = bucket_of_words(tensor, offset);
        Some(Place::new(home, slot, 0).exact_simple())
    }

    /// Counts a region that would fit another shape than its slot's, and
    /// refits the slot when [`TensorMap::place`] says (out of line: the
    /// common case does not come here).
    #[inline(never)]
    fn refit(&mut self, slot: usize, region: &Region) {
        let (head, tail) = (self.head, self.tail);
        let shape = &mut self.shapes[slot];
        let fitted = fit(region.extent);
        if word(fitted) == word(shape.mask) {
            shape.misfits = 0;
        } else {
            shape.misfits = shape.misfits.saturating_add(1);
            // The entries placed with the current shape are all before the
            // head unless an argument of this submission was placed with it
            // (`newest == head`); they become the previous shape's.
            let first = shape.newest == NONE;
            let free = shape.newest < head && shape.prev_end <= tail && shape.crossing < tail;
            if first || (shape.misfits >= REFIT && free) {
                if shape.newest >= tail {
                    shape.prev_mask = shape.mask;
                    shape.prev_end = head;
                    shape.odd = shape.odd.max(head - 1);
                }
                shape.mask = fitted;
                shape.size = fitted.map(|m| !m + 1);
                self.fits[slot] = Fit::of(shape);
                shape.misfits = 0;
            }
        }
        shape.newest = head;
    }

    /// [`TensorMap::place`] with the slot's current shape (out of line: the
    /// common case does not come here).
    #[inline(never)]
    fn place_in(&self, slot: usize, tensor: u32, region: &Region) -> Place {
        let shape = &self.shapes[slot];
        // The common case, a tile that is exactly one cell: its offset has
        // no bits inside a cell and its extent is the cell's.
        let inexact =
            word(region.offset) & !word(shape.mask) | word(region.extent) ^ word(shape.size);
        let simple = shape.odd < self.tail;
        let (back, wide_live) = (shape.crossing >= self.tail, shape.wide >= self.tail);
        let prev = shape.prev_end > self.tail;
        let live_flags = if simple {
            0
        } else {
            (back as u8 * Place::BACK)
                | (wide_live as u8 * Place::WIDE_LIVE)
                | (prev as u8 * Place::PREV)
        };
        if inexact == 0 {
            let flags =
                Place::EXACT | Place::ONE_CELL | (simple as u8 * Place::SIMPLE) | live_flags;
            return Place::new(bucket(tensor, region.offset), slot, flags);
        }
        // Bit tricks, OR-ed over the dimensions, branch-free: the first and
        // last element lie in different cells iff they differ above the cell
        // bits. A region that wraps past u32::MAX is either longer than a
        // cell (large) or has its last element far below its first
        // (crossing); an extent of 0 wraps to a large `extent - 1`. A cell
        // is named by its first element.
        let (mut spread, mut largest) = (0u32, 0u32);
        for d in 0..MAX_RANK {
            let (first, extent, mask) = (region.offset[d], region.extent[d], shape.mask[d]);
            spread |= (first ^ first.wrapping_add(extent).wrapping_sub(1)) & mask;
            largest |= extent.wrapping_sub(1) & mask;
        }
        let cell = core::array::from_fn(|d| region.offset[d] & shape.mask[d]);
        let (crossing, large) = (spread != 0, largest != 0);
        let flag = |on: bool, flag: u8| on as u8 * flag;
        let flags = flag(simple & !crossing, Place::SIMPLE)
            | flag(!crossing, Place::ONE_CELL)
            | flag(large, Place::WIDE)
            | flag(crossing & !large, Place::CROSSING)
            | live_flags;
        let place = Place::new(bucket(tensor, if large { WIDE } else { cell }), slot, flags);
        // A region of whole cells that is not exact spans more than one.
        if large && whole_cells(shape.mask, region) {
            return Place(place.0 | WHOLE_PLACE);
        }
        place
    }

    /// The box of cells where an entry overlapping `region` can have its
    /// origin, or `None` if it holds more than [`MAX_PROBES`] cells.
    #[inline(always)]
    fn cells(&self, place: &Place, region: &Region) -> Option<Cells> {
        cells_of(
            self.shapes[place.slot()].mask,
            place.has(Place::BACK),
            region,
        )
    }

    /// [`TensorMap::cells`] with the slot's previous shape (whose entries
    /// do not reach over a cell boundary).
    #[inline(always)]
    fn prev_cells(&self, place: &Place, region: &Region) -> Option<Cells> {
        cells_of(self.shapes[place.slot()].prev_mask, false, region)
    }

    /// Calls `f` with every bucket a lookup of `region` of `tensor` probes.
    #[inline(always)]
    fn probe(&self, place: &Place, tensor: u32, region: &Region, mut f: impl FnMut(usize)) {
        if place.has(Place::PREV) {
            let Some(cells) = self.prev_cells(place, region) else {
                (0..BUCKETS).for_each(f);
                return;
            };
            let mut cell = cells.0;
            loop {
                f(bucket(tensor, cell));
                if !next_cell(&mut cell, &cells) {
                    break;
                }
            }
        }
        let Some(cells) = self.cells(place, region) else {
            (0..BUCKETS).for_each(f);
            return;
        };
        if place.has(Place::WIDE_LIVE) {
            f(bucket(tensor, WIDE));
        }
        let mut cell = cells.0;
        loop {
            f(bucket(tensor, cell));
            if !next_cell(&mut cell, &cells) {
                return;
            }
        }
    }

    /// The task of an entry not reclaimed.
    #[inline(always)]
    fn task_of(&self, e: &Entry) -> u64 {
        let newest = self.newest_task;
        newest - (newest as u32).wrapping_sub(e.task) as u64
    }

    /// Links the entry at `position` to the older `next` (or [`NONE`]).
    #[inline(always)]
    fn set_next(&mut self, position: u64, next: u64) {
        let e = self.at_mut(position);
        e.link = e.link & !POSITION | next;
    }

    fn at(&self, position: u64) -> &Entry {
        &self.entries[(position & (Self::SPAN - 1)) as usize]
    }

    fn at_mut(&mut self, position: u64) -> &mut Entry {
        &mut self.entries[(position & (Self::SPAN - 1)) as usize]
    }

    /// The position after `position`, skipping the rest of its block
    /// ([`TensorMap::SPAN`]) after its `N`th.
    #[inline(always)]
    fn after(position: u64) -> u64 {
        let next = position + 1;
        if next & (Self::SPAN - 1) == N as u64 {
            next + (Self::SPAN - N as u64)
        } else {
            next
        }
    }

    /// Entries allocated and not yet reclaimed: the positions from the tail
    /// to the head but those skipped at the end of each block passed.
    pub fn used(&self) -> usize {
        let blocks = self.head / Self::SPAN - self.tail / Self::SPAN;
        (self.head - self.tail - blocks * (Self::SPAN - N as u64)) as usize
    }

    /// Entries free.
    pub fn available(&self) -> usize {
        N - self.used()
    }

    /// The position after the newest entry: a task records it after
    /// inserting its entries and hands it to [`TensorMap::release_until`]
    /// when it retires.
    pub fn end(&self) -> u64 {
        self.head
    }

    /// Reclaims every entry before position `end` (the tasks that inserted
    /// them have retired).
    pub fn release_until(&mut self, end: u64) {
        debug_assert!(self.tail <= end && end <= self.head, "reclaimed in order");
        self.tail = end;
    }

    /// Starts a submission's counting scans (`mark_now` false): forgets the
    /// covered entries earlier ones remembered for
    /// [`TensorMap::cover_pending`]. Committing scans remember none and
    /// need no `begin`.
    pub fn begin(&mut self) {
        self.pending_len = 0;
    }

    /// Scans for the earlier accesses that conflict with a new argument
    /// (at least one of the two writes), placed by [`TensorMap::place`] during this submission. Entries of tasks that are no longer
    /// [`Visitor::live`] are unlinked; for every live one whose region
    /// overlaps it calls [`Visitor::conflict`].
    /// When the argument writes, live overlapping entries its region covers
    /// are remembered for [`TensorMap::cover_pending`], or unlinked at once
    /// when `mark_now` (the submission is committing).
    #[inline(always)]
    pub fn scan(
        &mut self,
        place: &Place,
        tensor: u32,
        region: &Region,
        writes: bool,
        mark_now: bool,
        v: &mut impl Visitor,
    ) {
        let mut scan = Scan {
            bound: NONE,
            tensor,
            region,
            exact: place.has(Place::EXACT) && !place.has(Place::PREV),
            writes,
            mark_now,
            whole: false,
            cell: 0,
            reader: 0,
        };
        // The common case: a tile inside one cell, no entry reaching over,
        // no wide entry.
        if place.has(Place::SIMPLE) {
            self.scan_simple(place, tensor, region, writes, mark_now, v);
            return;
        }
        // The cells of the previous shape, as `probe` does; too many to
        // list, and every bucket is all there is to scan. (They are worked
        // out again for their scan below rather than kept: 48 bytes kept
        // across the scans cost the common case a copy through the stack
        // per argument.)
        let prev = place.has(Place::PREV);
        if prev && self.prev_cells(place, region).is_none() {
            self.scan_every_bucket(&mut scan, v);
            return;
        }
        // Where a live writer of all of the region most likely is first (a
        // tile's own cell, or the wide bucket for a larger region), so that
        // the scans after it stop at it.
        if place.has(Place::ONE_CELL) && !place.has(Place::BACK) {
            self.scan_bucket(place.home(), &mut scan, v);
            if place.has(Place::WIDE_LIVE) {
                self.scan_bucket(bucket(tensor, WIDE), &mut scan, v);
            }
        } else {
            // The wide bucket (a wide argument's home), as `probe` does.
            if place.has(Place::WIDE_LIVE) {
                self.scan_bucket(bucket(tensor, WIDE), &mut scan, v);
            }
            let cells = self.cells(place, region);
            let mask = self.shapes[place.slot()].mask;
            scan.whole = !place.has(Place::BACK | Place::PREV) && whole_cells(mask, region);
            self.scan_cells(cells, &mut scan, v);
            scan.whole = false;
        }
        if prev {
            // Listed: checked above.
            if let Some(cells) = self.prev_cells(place, region) {
                self.scan_listed(&cells, &mut scan, v);
            }
        }
    }

    /// [`TensorMap::scan`] of an argument placed [`Place::simple`]: its
    /// home bucket, whose older entries a committing write unlinked as it
    /// covered them, so no bound to keep and no implied conflict to report
    /// ([`Visitor::cut`]).
    #[inline(always)]
    pub fn scan_simple(
        &mut self,
        place: &Place,
        tensor: u32,
        region: &Region,
        writes: bool,
        mark_now: bool,
        v: &mut impl Visitor,
    ) {
        debug_assert!(place.simple(), "a simple place's scan");
        // Simple: no entry of a previous shape is live, so exactness is
        // of the current shape.
        let mut scan = Scan {
            bound: NONE,
            tensor,
            region,
            exact: place.has(Place::EXACT),
            writes,
            mark_now,
            whole: false,
            cell: 0,
            reader: 0,
        };
        if writes {
            self.scan_chain::<false, 0>(place.home(), &mut scan, v);
        }
        self.scan_chain::<false, 1>(place.home(), &mut scan, v);
    }

    /// [`TensorMap::scan_simple`] with `mark_now`, then
    /// [`TensorMap::push`]: a committing submission's argument placed
    /// [`Place::simple`]. (Skipping the scan of a home bucket whose chains
    /// hold nothing since the tail cost more than it saved: BENCHMARKS.md.)
    #[inline(always)]
    pub(crate) fn scan_push_simple(
        &mut self,
        place: &Place,
        tensor: u32,
        region: &Region,
        writes: bool,
        task: u64,
        v: &mut impl Visitor,
    ) {
        self.scan_simple(place, tensor, region, writes, true, v);
        self.push(place, tensor, *region, writes, task);
    }

    /// [`TensorMap::scan`] of a committing submission's argument, then
    /// [`TensorMap::push`].
    #[inline(always)]
    pub(crate) fn scan_push(
        &mut self,
        place: &Place,
        tensor: u32,
        region: &Region,
        writes: bool,
        task: u64,
        v: &mut impl Visitor,
    ) {
        self.scan(place, tensor, region, writes, true, v);
        self.push(place, tensor, *region, writes, task);
    }

    /// Scans the buckets of `cells`, or every bucket when the region's
    /// cells are too many to list (`None`).
    #[inline(always)]
    fn scan_cells(&mut self, cells: Option<Cells>, scan: &mut Scan, v: &mut impl Visitor) {
        let Some(cells) = cells else {
            scan.whole = false;
            self.scan_every_bucket(scan, v);
            return;
        };
        self.scan_listed(&cells, scan, v);
    }

    /// Scans the buckets of `cells`.
    #[inline(always)]
    fn scan_listed(&mut self, cells: &Cells, scan: &mut Scan, v: &mut impl Visitor) {
        let mut cell = cells.0;
        loop {
            scan.cell = word(cell);
            self.scan_bucket(bucket(scan.tensor, cell), scan, v);
            if !next_cell(&mut cell, cells) {
                return;
            }
        }
    }

    /// Scans every bucket.
    #[inline(always)]
    fn scan_every_bucket(&mut self, scan: &mut Scan, v: &mut impl Visitor) {
        for b in 0..BUCKETS {
            self.scan_bucket(b, scan, v);
        }
    }

    #[inline(always)]
    fn scan_bucket(&mut self, b: usize, scan: &mut Scan, v: &mut impl Visitor) {
        // Any access waits for writers, a write also for readers. Writers
        // first: a live writer of all of the region ends the scans after it
        // at its position.
        self.scan_chain::<true, 1>(b, scan, v);
        if scan.writes {
            self.scan_chain::<true, 0>(b, scan, v);
        }
    }

    /// [`TensorMap::scan_bucket`] of the readers' (0) or writers' (1)
    /// chain; with `BOUND`, ends at [`Scan::bound`] and moves it up to a
    /// live writer of all of the region.
    #[inline(always)]
    fn scan_chain<const BOUND: bool, const CHAIN: usize>(
        &mut self,
        b: usize,
        scan: &mut Scan,
        v: &mut impl Visitor,
    ) {
        let chain = CHAIN;
        let Scan {
            tensor,
            region,
            exact,
            writes,
            mark_now,
            ..
        } = *scan;
        let mut prev = NONE;
        let mut lower = if BOUND {
            self.tail.max(scan.bound)
        } else {
            self.tail
        };
        let mut position = self.buckets[b % BUCKETS][chain];
        while position >= lower {
            let e = self.at(position);
            let next = e.link & POSITION;
            let task = self.task_of(e);
            let keep = e.link & COVERED == 0 && v.live(task);
            let (overlap, covered, covers) = if keep && e.tensor == tensor {
                if exact && e.link & EXACT != 0 {
                    let same = e.region.offset == region.offset;
                    (same, same, same)
                } else if BOUND
                    && scan.whole
                    && e.link & EXACT != 0
                    && word(e.region.offset) == scan.cell
                {
                    // The probed cell, inside the region (which, not
                    // exact, is more than that cell).
                    (true, true, false)
                } else {
                    // A cell against whole cells of the same shape (the
                    // live entries of the tensor were all placed with it)
                    // is the other way round.
                    relation(region, &e.region, exact && e.link & WHOLE != 0)
                }
            } else {
                (false, false, false)
            };
            let mut keep = keep;
            if overlap {
                if chain == 1 && covers {
                    // A live writer of all of the scanned region: the
                    // entries before it need no visit.
                    v.cut(task);
                    if BOUND {
                        lower = position;
                        scan.bound = position;
                    }
                }
                if chain == 0 {
                    if covers {
                        scan.reader = scan.reader.max(task + 1);
                        v.covering_reader(task);
                    }
                    v.conflict(task);
                } else if task + 1 >= scan.reader {
                    // A writer before a live reader of all of the region
                    // was ordered before that reader (see `Scan::reader`).
                    v.writer_conflict(task);
                }
                if writes && covered {
                    if mark_now {
                        // Covered by the committing write: later tasks reach
                        // it through the new writer, so unlink it now.
                        keep = false;
                    } else {
                        if let Some(p) = self.pending.get_mut(self.pending_len) {
                            *p = position;
                        }
                        self.pending_len += 1;
                    }
                }
            }
            if keep {
                prev = position;
            } else if prev == NONE {
                self.buckets[b % BUCKETS][chain] = next;
            } else {
                self.set_next(prev, next);
            }
            position = next;
        }
    }

    /// Marks the covered entries the scans since [`TensorMap::begin`] found.
    /// `false` (marking nothing) if they were more than it remembers: the
    /// caller then rescans with `mark_now`.
    pub fn cover_pending(&mut self) -> bool {
        if self.pending_len > PENDING {
            return false;
        }
        for i in 0..self.pending_len {
            let position = self.pending[i];
            self.at_mut(position).link |= COVERED;
        }
        true
    }

    /// Records that `task` reads or writes `region` of `tensor`. `false` if
    /// the ring is full. Tasks come in order: `task` is at or after the
    /// task of every entry not reclaimed, and less than 2^32 after it.
    pub fn insert(
        &mut self,
        place: &Place,
        tensor: u32,
        region: Region,
        writes: bool,
        task: u64,
    ) -> bool {
        if self.used() == N {
            return false;
        }
        self.push(place, tensor, region, writes, task);
        true
    }

    /// [`TensorMap::insert`] for a caller that checked the room
    /// ([`TensorMap::available`]) before: a full ring would overwrite
    /// its oldest live entry.
    #[inline(always)]
    pub(crate) fn push(
        &mut self,
        place: &Place,
        tensor: u32,
        region: Region,
        writes: bool,
        task: u64,
    ) {
        debug_assert!(self.used() < N, "TensorMap room was checked");
        let position = self.head;
        self.head = Self::after(position);
        let head = &mut self.buckets[place.home()][writes as usize];
        let next = core::mem::replace(head, position);
        self.newest_task = task;
        *self.at_mut(position) = Entry {
            tensor,
            task: task as u32,
            link: next | if place.has(Place::EXACT) { EXACT } else { 0 },
            region,
        };
        if place.has(Place::WIDE | Place::CROSSING) {
            let shape = &mut self.shapes[place.slot()];
            if place.has(Place::WIDE) {
                shape.wide = position;
            } else {
                shape.crossing = position;
            }
            shape.odd = position;
            // Here, not with the flags above: the common case pays nothing.
            if place.whole() {
                self.at_mut(position).link |= WHOLE;
            }
        }
    }

    /// Entries of `tensor` a lookup of `region` would still visit: live
    /// links that are not yet known to be covered (for tests of chain
    /// length).
    pub fn chain_len(&self, tensor: u32, region: &Region) -> usize {
        let mut len = 0;
        let mut count = |b: usize| {
            for chain in 0..2 {
                let mut position = self.buckets[b][chain];
                while position >= self.tail {
                    let e = self.at(position);
                    len += (e.link & COVERED == 0 && e.tensor == tensor) as usize;
                    position = e.link & POSITION;
                }
            }
        };
        let place = self.place_in(tensor as usize % SHAPES, tensor, region);
        self.probe(&place, tensor, region, &mut count);
        len
    }
}

impl<const N: usize> Default for TensorMap<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the tasks a scan reports; every task is live.
    struct Found(Vec<u64>);

    impl Visitor for Found {
        fn live(&self, _: u64) -> bool {
            true
        }
        fn conflict(&mut self, task: u64) {
            self.0.push(task);
        }
    }

    /// A xorshift generator from `seed`: `next(below)` is in `0..below`.
    fn xorshift(mut state: u64) -> impl FnMut(u32) -> u32 {
        move |below| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % below as u64) as u32
        }
    }

    /// Every element of `r`, listed.
    fn elements(r: &Region) -> std::collections::BTreeSet<[u32; MAX_RANK]> {
        let mut set = std::collections::BTreeSet::new();
        for a in r.offset[0]..r.offset[0] + r.extent[0] {
            for b in r.offset[1]..r.offset[1] + r.extent[1] {
                for c in r.offset[2]..r.offset[2] + r.extent[2] {
                    for d in r.offset[3]..r.offset[3] + r.extent[3] {
                        set.insert([a, b, c, d]);
                    }
                }
            }
        }
        set
    }

    fn tile(start: u32) -> Region {
        Region {
            offset: [start, 0, 0, 0],
            extent: [4, 1, 1, 1],
        }
    }

    #[test]
    fn exact_tiles_that_share_a_bucket_do_not_conflict() {
        // Two 4-element cells of tensor 5 whose entries share a bucket.
        let home = |i: u32| bucket(5, tile(4 * i).offset);
        let (i, j) = (1..)
            .flat_map(|j| (0..j).map(move |i| (i, j)))
            .find(|&(i, j)| home(i) == home(j))
            .unwrap();
        let mut map = TensorMap::<16>::new();
        for (task, start) in [(1, 4 * i), (2, 4 * j)] {
            let place = map.place(5, &tile(start));
            assert!(place.exact());
            let mut found = Found(Vec::new());
            map.begin();
            map.scan(&place, 5, &tile(start), true, true, &mut found);
            assert!(found.0.is_empty(), "cells {i} and {j} are disjoint");
            assert!(map.insert(&place, 5, tile(start), true, task));
        }
        // A write of cell j again conflicts with its writer alone, and
        // covers it.
        let place = map.place(5, &tile(4 * j));
        let mut found = Found(Vec::new());
        map.begin();
        map.scan(&place, 5, &tile(4 * j), true, true, &mut found);
        assert_eq!(found.0, [2]);
        assert_eq!(map.chain_len(5, &tile(4 * j)), 1, "task 1's entry only");
    }

    /// A write after "task 1 writes a tile, task 2 reads all of it"
    /// conflicts with the reader only: the reader was ordered after the
    /// writer. A reader of part of the tile, or one older than the writer,
    /// orders nothing, and both conflicts are reported.
    #[test]
    fn a_write_skips_writers_a_newer_reader_of_all_of_it_follows() {
        let scan = |accesses: &[(u64, Region, bool)], region: Region| {
            let mut map = TensorMap::<16>::new();
            for &(task, r, writes) in accesses {
                let place = map.place(5, &r);
                assert!(map.insert(&place, 5, r, writes, task));
            }
            let place = map.place(5, &region);
            let mut found = Found(Vec::new());
            map.begin();
            map.scan(&place, 5, &region, true, false, &mut found);
            found.0.sort_unstable();
            found.0
        };
        let half = Region {
            offset: [4, 0, 0, 0],
            extent: [2, 1, 1, 1],
        };
        assert_eq!(
            scan(&[(1, tile(4), true), (2, tile(4), false)], tile(4)),
            [2]
        );
        assert_eq!(
            scan(&[(1, tile(4), true), (2, half, false)], tile(4)),
            [1, 2]
        );
        assert_eq!(
            scan(&[(1, tile(4), false), (2, tile(4), true)], tile(4)),
            [1, 2]
        );
        // The same for a write of part of the tile the reader read.
        assert_eq!(scan(&[(1, tile(4), true), (2, tile(4), false)], half), [2]);
    }

    /// Records the tasks a scan reports and counts the entries it visits
    /// (one [`Visitor::live`] question each); every task is live.
    struct Visits {
        asked: core::cell::Cell<usize>,
        found: Vec<u64>,
    }

    impl Visitor for Visits {
        fn live(&self, _: u64) -> bool {
            self.asked.set(self.asked.get() + 1);
            true
        }
        fn conflict(&mut self, task: u64) {
            self.found.push(task);
        }
    }

    #[test]
    fn a_tile_write_stops_at_the_live_writer_of_its_tile() {
        // Rounds of a write of one 1x1 tile of a 4x4 tensor and a read of
        // all of it (reads never cover each other, so every round's read
        // stays linked). The last write needs only the last round's writer
        // and read: the reads before that writer are ordered before it.
        let cell = Region {
            offset: [0; MAX_RANK],
            extent: [1; MAX_RANK],
        };
        let all = Region {
            offset: [0; MAX_RANK],
            extent: [4, 4, 1, 1],
        };
        let mut map = TensorMap::<64>::new();
        let mut task = 0;
        for (region, writes) in [(cell, true), (all, false)].repeat(8) {
            task += 1;
            let place = map.place(5, &region);
            map.begin();
            map.scan(&place, 5, &region, writes, true, &mut Found(Vec::new()));
            assert!(map.insert(&place, 5, region, writes, task));
        }
        let place = map.place(5, &cell);
        assert!(!place.simple(), "a wide read is live");
        let mut visits = Visits {
            asked: Default::default(),
            found: Vec::new(),
        };
        map.begin();
        map.scan(&place, 5, &cell, true, true, &mut visits);
        visits.found.sort();
        assert_eq!(visits.found, [task - 1, task], "the last writer and read");
        assert!(
            visits.asked.get() <= 3,
            "visited {} entries, not the older rounds'",
            visits.asked.get()
        );
    }

    #[test]
    fn a_write_of_whole_cells_covers_the_tiles_inside_it_only() {
        // One-element tiles of a 4 x 4 tensor, each written once; then a
        // write of the 2 x 2 block at the origin (whole cells).
        let at = |r: u32, c: u32, side: u32| Region {
            offset: [r, c, 0, 0],
            extent: [side, side, 1, 1],
        };
        let mut map = TensorMap::<64>::new();
        let mut task = 0;
        for r in 0..4 {
            for c in 0..4 {
                task += 1;
                let place = map.place(5, &at(r, c, 1));
                map.begin();
                map.scan(&place, 5, &at(r, c, 1), true, true, &mut Found(Vec::new()));
                assert!(map.insert(&place, 5, at(r, c, 1), true, task));
            }
        }
        let block = at(0, 0, 2);
        let place = map.place(5, &block);
        assert!(!place.exact() && !place.simple());
        let mut found = Found(Vec::new());
        map.begin();
        map.scan(&place, 5, &block, true, true, &mut found);
        found.0.sort();
        assert_eq!(
            found.0,
            [1, 2, 5, 6],
            "the tiles of rows 0 and 1, columns 0 and 1"
        );
        assert!(map.insert(&place, 5, block, true, task + 1));
        // The block's write unlinked the tiles it covers: a lookup of one
        // of them meets the block's entry only; the others keep theirs.
        assert_eq!(map.chain_len(5, &at(1, 1, 1)), 1, "the block only");
        assert_eq!(map.chain_len(5, &at(2, 2, 1)), 2, "its tile and the block");
    }

    #[test]
    fn a_tile_meets_whole_cells_only_inside_them() {
        // One-element tiles of a 4 x 4 tensor; then the 2 x 2 block at row
        // 2, column 0 (whole cells, wide), written by task 2 and read by
        // task 3. A tile inside the block conflicts with both (a read with
        // the write only); a tile outside it with neither.
        let at = |r: u32, c: u32, side: u32| Region {
            offset: [r, c, 0, 0],
            extent: [side, side, 1, 1],
        };
        let mut map = TensorMap::<64>::new();
        let first = map.place(5, &at(0, 0, 1));
        assert!(first.exact());
        map.begin();
        map.scan(&first, 5, &at(0, 0, 1), true, true, &mut Found(Vec::new()));
        assert!(map.insert(&first, 5, at(0, 0, 1), true, 1));
        let block = at(2, 0, 2);
        for (task, writes) in [(2, true), (3, false)] {
            let place = map.place(5, &block);
            assert!(place.whole() && !place.exact());
            map.begin();
            map.scan(&place, 5, &block, writes, true, &mut Found(Vec::new()));
            assert!(map.insert(&place, 5, block, writes, task));
        }
        // Not whole cells: starts inside a cell of the block's shape
        // (1 x 1 here, so any wide region is whole; use a 2 x 2 grid).
        let mut coarse = TensorMap::<64>::new();
        let tile2 = coarse.place(6, &at(0, 0, 2));
        coarse.begin();
        coarse.scan(&tile2, 6, &at(0, 0, 2), true, true, &mut Found(Vec::new()));
        assert!(coarse.insert(&tile2, 6, at(0, 0, 2), true, 1));
        assert!(
            !coarse.place(6, &at(1, 1, 4)).whole(),
            "offset inside a cell"
        );
        assert!(coarse.place(6, &at(0, 2, 4)).whole(), "four 2 x 2 cells");

        let lookup = |map: &mut TensorMap<64>, r, c, writes| {
            let region = at(r, c, 1);
            let place = map.place(5, &region);
            assert!(place.exact() && !place.simple(), "the block is live");
            let mut found = Found(Vec::new());
            map.begin();
            map.scan(&place, 5, &region, writes, false, &mut found);
            found.0.sort();
            found.0
        };
        for (r, c) in [(2, 0), (2, 1), (3, 0), (3, 1)] {
            assert_eq!(lookup(&mut map, r, c, false), [2], "({r}, {c}) read");
            assert_eq!(lookup(&mut map, r, c, true), [2, 3], "({r}, {c}) write");
        }
        for (r, c) in [(1, 0), (2, 2), (3, 3), (1, 1)] {
            assert_eq!(lookup(&mut map, r, c, true), [], "({r}, {c}) write");
        }
        assert_eq!(lookup(&mut map, 0, 0, false), [1], "the first tile");
    }

    /// `relation` of one cell to whole cells of its shape (the case of
    /// [`Place::whole`]) against element sets: random cell shapes of 1, 2
    /// or 4 elements per dimension in an 8 x 8 x 2 x 1 grid, a random cell,
    /// and a random box of whole cells that is more than one cell.
    #[test]
    fn a_cell_against_whole_cells_agrees_with_element_sets() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
        let grid = [8, 8, 2, 1];
        let (mut tested, mut inside) = (0, 0);
        while tested < 2000 {
            let size: [u32; MAX_RANK] = core::array::from_fn(|d| (1 << next(3)).min(grid[d]));
            let cells: [u32; MAX_RANK] = core::array::from_fn(|d| grid[d] / size[d]);
            let cell = Region {
                offset: core::array::from_fn(|d| next(cells[d]) * size[d]),
                extent: size,
            };
            let first: [u32; MAX_RANK] = core::array::from_fn(|d| next(cells[d]));
            let whole = Region {
                offset: core::array::from_fn(|d| first[d] * size[d]),
                extent: core::array::from_fn(|d| (1 + next(cells[d] - first[d])) * size[d]),
            };
            if whole.extent == size {
                continue; // one cell: exact, not whole
            }
            assert!(whole_cells(fit(size), &whole), "{whole:?}");
            let (n, o) = (elements(&cell), elements(&whole));
            let expected = (!n.is_disjoint(&o), o.is_subset(&n), n.is_subset(&o));
            assert_eq!(
                relation(&cell, &whole, true),
                expected,
                "{cell:?} {whole:?}"
            );
            tested += 1;
            inside += expected.0 as u32;
        }
        assert!(inside > 200 && inside < 1800, "both cases: {inside} inside");
    }

    #[test]
    fn the_wide_bucket_is_not_the_first_cells() {
        for tensor in 0..64 {
            assert_ne!(bucket(tensor, WIDE), bucket(tensor, [0; MAX_RANK]));
        }
    }

    #[test]
    fn a_committing_write_unlinks_the_entries_it_covers() {
        let mut map = TensorMap::<16>::new();
        for task in 1..=3 {
            let place = map.place(5, &tile(0));
            let mut found = Found(Vec::new());
            map.begin();
            map.scan(&place, 5, &tile(0), true, true, &mut found);
            let earlier: &[u64] = if task == 1 { &[] } else { &[task - 1] };
            assert_eq!(found.0, earlier, "each write waits for the one before");
            assert!(map.insert(&place, 5, tile(0), true, task));
        }
        // Each write covered the one before and unlinked it: the writers'
        // chain links task 3's entry alone, not the covered ones.
        let home = map.place(5, &tile(0)).home();
        let mut links = Vec::new();
        let mut position = map.buckets[home][1];
        while position >= map.tail {
            links.push(map.task_of(map.at(position)));
            position = map.at(position).link & POSITION;
        }
        assert_eq!(links, [3]);
    }

    #[test]
    fn task_numbers_past_32_bits_come_back_whole() {
        // Entries keep the low half of a task's number: readers of tasks
        // on both sides of 2^32 must each find the writer before them.
        let mut map = TensorMap::<16>::new();
        let first = (1u64 << 32) - 2;
        for task in first..first + 4 {
            let place = map.place(5, &tile(0));
            let mut found = Found(Vec::new());
            map.begin();
            map.scan(&place, 5, &tile(0), false, true, &mut found);
            let earlier: &[u64] = if task == first { &[] } else { &[task - 1] };
            assert_eq!(
                found.0, earlier,
                "task {task:#x} reads after the write before"
            );
            map.begin();
            map.scan(&place, 5, &tile(0), true, true, &mut found);
            assert!(map.insert(&place, 5, tile(0), true, task));
        }
    }

    /// Submits a random program of `tasks` tasks to `map`, from task
    /// `first`: each one argument on tensors 0-3, tiles of three sizes
    /// (fitting, refitting, crossing and wide entries), writes and reads,
    /// 12 tasks live. Returns, per task, its place and what its scan found.
    fn program(map: &mut TensorMap<32>, seed: u64, first: u64, tasks: u64) -> Vec<String> {
        let mut rand = xorshift(seed);
        let mut ends = Vec::new();
        let mut seen = Vec::new();
        for task in first..first + tasks {
            let tensor = rand(4);
            let size = [4, 8, 16][rand(3) as usize];
            let region = Region {
                offset: [rand(32), rand(32), 0, 0],
                extent: [size, size, 1, 1],
            };
            let writes = rand(2) == 0;
            let place = map.place(tensor, &region);
            let mut found = Found(Vec::new());
            map.begin();
            map.scan(&place, tensor, &region, writes, true, &mut found);
            seen.push(format!("{place:?} {:?}", found.0));
            assert!(map.insert(&place, tensor, region, writes, task));
            ends.push(map.end());
            if ends.len() > 12 {
                map.release_until(ends[ends.len() - 13]);
            }
        }
        seen
    }

    /// `place_exact`, the commit path's shortcut, gives `place`'s place
    /// whenever it gives one, in a random run that refits shapes and
    /// leaves crossing and wide entries live (when those are live it
    /// must refuse, and `place` says the place is not simple).
    #[test]
    fn the_shortcut_place_of_an_exact_tile_is_its_place() {
        let mut rand = xorshift(11);
        let mut map = TensorMap::<32>::new();
        let mut ends = Vec::new();
        let (mut taken, mut refused, mut refused_odd) = (0, 0, 0);
        for task in 0..6000 {
            let tensor = rand(4);
            // Mostly each tensor's own tile size, sometimes another.
            let sizes = [4, 8, 16];
            let size = sizes[if rand(8) == 0 { rand(3) } else { tensor % 3 } as usize];
            let offset = if rand(4) != 0 {
                [rand(4) * size, rand(4) * size, 0, 0]
            } else {
                [rand(64), rand(64), 0, 0]
            };
            let region = Region {
                offset,
                extent: [size, size, 1, 1],
            };
            let shortcut = map.place_exact(tensor, &region);
            let place = map.place(tensor, &region);
            match shortcut {
                Some(p) => {
                    assert_eq!(p.0, place.0, "task {task}: {region:?}");
                    assert!(p.simple() && p.exact());
                    taken += 1;
                }
                None if place.exact() && !place.simple() => refused_odd += 1,
                None => refused += 1,
            }
            let writes = rand(2) == 0;
            let mut found = Found(Vec::new());
            map.begin();
            map.scan(&place, tensor, &region, writes, true, &mut found);
            assert!(map.insert(&place, tensor, region, writes, task));
            ends.push(map.end());
            if ends.len() > 12 {
                map.release_until(ends[ends.len() - 13]);
            }
        }
        // Every case met often: taken, refused as not exact, and refused
        // as exact while an odd entry of the slot is live.
        assert!(
            taken > 500 && refused > 500 && refused_odd > 100,
            "{taken} {refused} {refused_odd}"
        );
    }

    #[test]
    fn a_recycled_map_places_and_finds_as_a_new_one() {
        for seed in 1..20 {
            let fresh = program(&mut TensorMap::new(), seed, 0, 300);
            let mut map = TensorMap::new();
            program(&mut map, seed + 100, 0, 300);
            map.release_until(map.end());
            map.recycle();
            assert_eq!(program(&mut map, seed, 0, 300), fresh, "seed {seed}");
        }
    }

    #[test]
    fn a_ring_of_three_entries_counts_and_reuses_them() {
        // Three entries: positions skip the fourth of each block of four.
        // Two tasks stay live (one entry each) while the ring wraps.
        let mut map = TensorMap::<3>::new();
        let mut ends = Vec::new();
        for task in 1..=20u64 {
            let place = map.place(7, &tile(0));
            let mut found = Found(Vec::new());
            map.begin();
            map.scan(&place, 7, &tile(0), true, true, &mut found);
            let earlier: &[u64] = if task == 1 { &[] } else { &[task - 1] };
            assert_eq!(found.0, earlier, "task {task} writes after the one before");
            assert!(map.insert(&place, 7, tile(0), true, task));
            ends.push(map.end());
            if task >= 3 {
                map.release_until(ends[task as usize - 3]);
            }
            assert_eq!(map.used(), task.min(2) as usize, "after task {task}");
            assert_eq!(map.available(), 3 - task.min(2) as usize);
        }
        let place = map.place(7, &tile(4));
        assert!(map.insert(&place, 7, tile(4), false, 21));
        assert_eq!(map.available(), 0);
        assert!(
            !map.insert(&place, 7, tile(4), false, 22),
            "the ring is full"
        );
    }

    /// `relation` against element sets: random non-empty 4-D boxes in a
    /// 4 x 4 x 4 x 4 grid (half of the pairs with the same last two
    /// dimensions, the case `relation` shortens), every element listed.
    #[test]
    fn relation_agrees_with_element_sets() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
        let boxed = |next: &mut dyn FnMut(u32) -> u32| {
            let offset: [u32; MAX_RANK] = core::array::from_fn(|_| next(4));
            let extent: [u32; MAX_RANK] = core::array::from_fn(|d| 1 + next(4 - offset[d]));
            Region { offset, extent }
        };
        let mut shortened = 0;
        for i in 0..4000 {
            let new = boxed(&mut next);
            let mut old = boxed(&mut next);
            if i % 2 == 0 {
                old.offset[LEAD..].copy_from_slice(&new.offset[LEAD..]);
                old.extent[LEAD..].copy_from_slice(&new.extent[LEAD..]);
                shortened += 1;
            }
            let (n, o) = (elements(&new), elements(&old));
            let expected = (!n.is_disjoint(&o), o.is_subset(&n), n.is_subset(&o));
            assert_eq!(relation(&new, &old, false), expected, "{new:?} {old:?}");
        }
        assert_eq!(shortened, 2000);
    }
}
