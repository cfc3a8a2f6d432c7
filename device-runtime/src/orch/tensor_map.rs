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
//! already met), and a new write marks older entries whose region it fully
//! covers, which the next scan unlinks (later tasks reach those through the
//! new writer, which waits for them). Unlinking shortens chains; the ring
//! space comes back when the task retires.
//!
//! Sizing: a task uses one entry per tensor argument until it retires, so
//! `N >= task window x arguments per task` means the TensorMap never stalls
//! on its own.

use crate::abi::{Region, MAX_RANK};

/// Buckets of the TensorMap (a power of two); tensors hash by their key.
pub const BUCKETS: usize = 256;

/// Covered entries a scan remembers for the commit (more: the commit rescans).
const PENDING: usize = 16;

/// "No entry": positions start at 1, and the tail never falls below 1.
const NONE: u64 = 0;

#[derive(Clone, Copy, Debug)]
struct Entry {
    tensor: u32,
    /// A newer write covers this entry's region: skip it and unlink it.
    covered: bool,
    region: Region,
    task: u64,
    /// Position of the next (older) entry of the bucket chain.
    next: u64,
}

const EMPTY: Entry = Entry {
    tensor: 0,
    covered: false,
    region: Region {
        offset: [0; MAX_RANK],
        extent: [0; MAX_RANK],
    },
    task: 0,
    next: NONE,
};

/// `N` entries in a ring.
pub struct TensorMap<const N: usize> {
    entries: [Entry; N],
    /// Per bucket: the newest reader entry and the newest writer entry.
    buckets: [[u64; 2]; BUCKETS],
    /// Position the next entry gets.
    head: u64,
    /// Oldest position not reclaimed.
    tail: u64,
    /// Positions of entries the current submission's writes cover (the first
    /// [`PENDING`]), marked when it commits.
    pending: [u64; PENDING],
    /// How many covered entries the scans since [`TensorMap::begin`] found.
    pending_len: usize,
}

fn bucket(tensor: u32) -> usize {
    (tensor.wrapping_mul(0x9E37_79B1) >> 24) as usize % BUCKETS
}

/// Whether `outer` contains every element of `inner`.
#[inline]
fn covers(outer: &Region, inner: &Region) -> bool {
    let mut all = true;
    for d in 0..MAX_RANK {
        let (o0, i0) = (outer.offset[d] as u64, inner.offset[d] as u64);
        all &= (o0 <= i0) & (i0 + inner.extent[d] as u64 <= o0 + outer.extent[d] as u64);
    }
    all
}

impl<const N: usize> TensorMap<N> {
    pub const fn new() -> Self {
        TensorMap {
            entries: [EMPTY; N],
            buckets: [[NONE; 2]; BUCKETS],
            head: 1,
            tail: 1,
            pending: [NONE; PENDING],
            pending_len: 0,
        }
    }

    fn at(&self, position: u64) -> &Entry {
        &self.entries[(position % N as u64) as usize]
    }

    fn at_mut(&mut self, position: u64) -> &mut Entry {
        &mut self.entries[(position % N as u64) as usize]
    }

    /// Entries allocated and not yet reclaimed.
    pub fn used(&self) -> usize {
        (self.head - self.tail) as usize
    }

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

    /// Starts a submission's scans: forgets covered entries of earlier ones.
    pub fn begin(&mut self) {
        self.pending_len = 0;
    }

    /// Scans for the earlier accesses that conflict with a new argument
    /// (at least one of the two writes). For every entry of the bucket's
    /// relevant chains it calls `f(task, overlapping)`, which returns whether
    /// that task is still live; entries of tasks that are not are unlinked.
    /// When the argument writes, live overlapping entries its region covers
    /// are remembered for [`TensorMap::cover_pending`], or marked at once
    /// when `mark_now` (the submission is committing).
    #[inline(always)]
    pub fn scan(
        &mut self,
        tensor: u32,
        region: &Region,
        writes: bool,
        mark_now: bool,
        mut f: impl FnMut(u64, bool) -> bool,
    ) {
        let b = bucket(tensor);
        // A write also waits for readers; any access waits for writers.
        for chain in (!writes) as usize..2 {
            let mut prev = NONE;
            let mut position = self.buckets[b][chain];
            while position >= self.tail {
                let e = self.at(position);
                let next = e.next;
                let keep = !e.covered && {
                    let overlapping = e.tensor == tensor && e.region.overlaps(region);
                    let covered = overlapping && writes && covers(region, &e.region);
                    let live = f(e.task, overlapping);
                    if live && covered {
                        if mark_now {
                            self.at_mut(position).covered = true;
                        } else {
                            if let Some(p) = self.pending.get_mut(self.pending_len) {
                                *p = position;
                            }
                            self.pending_len += 1;
                        }
                    }
                    live
                };
                if keep {
                    prev = position;
                } else if prev == NONE {
                    self.buckets[b][chain] = next;
                } else {
                    self.at_mut(prev).next = next;
                }
                position = next;
            }
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
            self.at_mut(position).covered = true;
        }
        true
    }

    /// Records that `task` reads or writes `region` of `tensor`. `false` if
    /// the ring is full.
    pub fn insert(&mut self, tensor: u32, region: Region, writes: bool, task: u64) -> bool {
        if self.used() == N {
            return false;
        }
        let position = self.head;
        self.head += 1;
        let head = &mut self.buckets[bucket(tensor)][writes as usize];
        let next = core::mem::replace(head, position);
        *self.at_mut(position) = Entry {
            tensor,
            covered: false,
            region,
            task,
            next,
        };
        true
    }

    /// Entries a scan of `tensor`'s bucket would still visit: live links
    /// that are not yet known to be covered (for tests of chain length).
    pub fn chain_len(&self, tensor: u32) -> usize {
        let mut len = 0;
        for chain in 0..2 {
            let mut position = self.buckets[bucket(tensor)][chain];
            while position >= self.tail {
                let e = self.at(position);
                len += !e.covered as usize;
                position = e.next;
            }
        }
        len
    }
}

impl<const N: usize> Default for TensorMap<N> {
    fn default() -> Self {
        Self::new()
    }
}
