//! The TensorMap: which live tasks read or write which regions of which
//! tensors, so that a new task finds the earlier tasks it must wait for.
//!
//! A new argument that reads a region depends on every live earlier writer
//! of an overlapping region (read-after-write). One that writes depends on
//! every live earlier writer (write-after-write) **and reader**
//! (write-after-read) of an overlapping region. Overlap is the exact
//! hyper-rectangle test of [`Region::overlaps`].
//!
//! Entries live in a fixed pool, chained per bucket (by tensor key) and per
//! task (for reclamation), both doubly linked. Three things keep chains short:
//! an entry whose task has completed is dropped when a scan meets it (a
//! dependency on a finished task is already met); a new write drops older
//! entries whose region it fully covers (later tasks reach them through the
//! new writer, which depends on them); and a retiring task's entries are freed.

use crate::abi::{Region, MAX_RANK};

use super::dep_pool::NIL;

/// Buckets of the TensorMap (a power of two); tensors hash by their key.
pub const BUCKETS: usize = 256;

#[derive(Clone, Copy, Debug)]
struct Entry {
    tensor: u32,
    writes: bool,
    region: Region,
    task: u64,
    bucket_prev: u32,
    bucket_next: u32,
    task_prev: u32,
    task_next: u32,
}

const EMPTY: Entry = Entry {
    tensor: 0,
    writes: false,
    region: Region {
        offset: [0; MAX_RANK],
        extent: [0; MAX_RANK],
    },
    task: 0,
    bucket_prev: NIL,
    bucket_next: NIL,
    task_prev: NIL,
    task_next: NIL,
};

/// `N` entries, for a task ring of `T` slots (task `id` uses slot `id % T`).
/// Each bucket keeps readers and writers in separate chains, so that a read,
/// which only waits for writers, never walks past readers.
pub struct TensorMap<const N: usize, const T: usize> {
    entries: [Entry; N],
    /// Per bucket: the chain of reader entries and the chain of writer entries.
    buckets: [[u32; 2]; BUCKETS],
    /// Per task slot: the first entry of that task's list.
    task_heads: [u32; T],
    free: u32,
    used: usize,
}

fn bucket(tensor: u32) -> usize {
    (tensor.wrapping_mul(0x9E37_79B1) >> 24) as usize % BUCKETS
}

/// Whether `outer` contains every element of `inner`.
fn covers(outer: &Region, inner: &Region) -> bool {
    (0..MAX_RANK).all(|d| {
        let (o0, i0) = (outer.offset[d] as u64, inner.offset[d] as u64);
        o0 <= i0 && i0 + inner.extent[d] as u64 <= o0 + outer.extent[d] as u64
    })
}

impl<const N: usize, const T: usize> TensorMap<N, T> {
    pub const fn new() -> Self {
        let mut entries = [EMPTY; N];
        let mut i = 0;
        while i + 1 < N {
            entries[i].task_next = (i + 1) as u32;
            i += 1;
        }
        TensorMap {
            entries,
            buckets: [[NIL; 2]; BUCKETS],
            task_heads: [NIL; T],
            free: if N == 0 { NIL } else { 0 },
            used: 0,
        }
    }

    pub fn used(&self) -> usize {
        self.used
    }

    pub fn available(&self) -> usize {
        N - self.used
    }

    /// Calls `producer` with the task id of every entry that overlaps the
    /// new argument and conflicts with it (at least one of the two writes).
    /// The caller skips tasks that have completed.
    pub fn producers(
        &self,
        tensor: u32,
        region: &Region,
        writes: bool,
        mut producer: impl FnMut(u64),
    ) {
        let chains = &self.buckets[bucket(tensor)];
        // A write also waits for readers; any access waits for writers.
        for &first in &chains[(!writes) as usize..] {
            let mut i = first;
            while let Some(e) = self.entries.get(i as usize) {
                if e.tensor == tensor && e.region.overlaps(region) {
                    producer(e.task);
                }
                i = e.bucket_next;
            }
        }
    }

    /// Drops, in `tensor`'s bucket, the entries of tasks for which `dead`
    /// holds and, when the new argument writes, the entries of `tensor`
    /// whose region `region` covers (later tasks reach those through the new
    /// writer, which waits for them).
    pub fn prune(
        &mut self,
        tensor: u32,
        region: &Region,
        writes: bool,
        dead: impl Fn(u64) -> bool,
    ) {
        // Reads prune nothing: a read covers no earlier access for later ones.
        if !writes {
            return;
        }
        for chain in 0..2 {
            let mut i = self.buckets[bucket(tensor)][chain];
            while let Some(e) = self.entries.get(i as usize).copied() {
                if dead(e.task) || (e.tensor == tensor && covers(region, &e.region)) {
                    self.remove(i);
                }
                i = e.bucket_next;
            }
        }
    }

    /// Drops the entries of every task for which `dead` holds.
    pub fn sweep(&mut self, dead: impl Fn(u64) -> bool) {
        for b in 0..BUCKETS {
            for chain in 0..2 {
                let mut i = self.buckets[b][chain];
                while let Some(e) = self.entries.get(i as usize).copied() {
                    if dead(e.task) {
                        self.remove(i);
                    }
                    i = e.bucket_next;
                }
            }
        }
    }

    /// Records that `task` reads or writes `region` of `tensor`. `false` if
    /// the pool is full.
    pub fn insert(&mut self, tensor: u32, region: Region, writes: bool, task: u64) -> bool {
        let i = self.free;
        let Some(slot) = self.entries.get(i as usize) else {
            return false;
        };
        self.free = slot.task_next;
        let b = bucket(tensor);
        let old_bucket_head = self.buckets[b][writes as usize];
        let task_head = &mut self.task_heads[(task % T as u64) as usize];
        self.entries[i as usize] = Entry {
            tensor,
            writes,
            region,
            task,
            bucket_prev: NIL,
            bucket_next: old_bucket_head,
            task_prev: NIL,
            task_next: *task_head,
        };
        let old_task_head = core::mem::replace(task_head, i);
        if let Some(next) = self.entries.get_mut(old_bucket_head as usize) {
            next.bucket_prev = i;
        }
        self.buckets[b][writes as usize] = i;
        if let Some(next) = self.entries.get_mut(old_task_head as usize) {
            next.task_prev = i;
        }
        self.used += 1;
        true
    }

    /// Frees every entry of `task` (it retires).
    pub fn release_task(&mut self, task: u64) {
        let slot = (task % T as u64) as usize;
        while self.task_heads[slot] != NIL {
            self.remove(self.task_heads[slot]);
        }
    }

    fn remove(&mut self, i: u32) {
        let e = self.entries[i as usize];
        let task_head = &mut self.task_heads[(e.task % T as u64) as usize];
        match self.entries.get_mut(e.bucket_prev as usize) {
            Some(prev) => prev.bucket_next = e.bucket_next,
            None => self.buckets[bucket(e.tensor)][e.writes as usize] = e.bucket_next,
        }
        if let Some(next) = self.entries.get_mut(e.bucket_next as usize) {
            next.bucket_prev = e.bucket_prev;
        }
        if e.task_prev == NIL {
            *task_head = e.task_next;
        } else {
            self.entries[e.task_prev as usize].task_next = e.task_next;
        }
        if let Some(next) = self.entries.get_mut(e.task_next as usize) {
            next.task_prev = e.task_prev;
        }
        // A free entry is only read for its free-list link.
        self.entries[i as usize].task_next = self.free;
        self.free = i;
        self.used -= 1;
    }
}

impl<const N: usize, const T: usize> Default for TensorMap<N, T> {
    fn default() -> Self {
        Self::new()
    }
}
