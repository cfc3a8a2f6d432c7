//! The heap ring: bump allocation of intermediate output buffers from a
//! fixed arena, freed in retirement order, never straddling the wrap point.
//!
//! The ring hands out byte offsets; the memory itself belongs to the caller.
//! Live allocations occupy `[tail, head)` (modulo the wrap). A request that
//! does not fit before the end goes to offset 0 and the skipped bytes stay
//! accounted as used until the allocation before them is freed.

/// An allocation: `offset .. offset + len` in the arena.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapBlock {
    /// Byte offset in the arena.
    pub offset: u64,
    /// Length in bytes (a multiple of [`HEAP_ALIGN`]); the ring's tail
    /// moves to `offset + len` when the block is freed.
    pub len: u64,
}

impl HeapBlock {
    /// No allocation.
    pub const EMPTY: HeapBlock = HeapBlock { offset: 0, len: 0 };
}

/// Why an allocation failed.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapError {
    /// Not enough contiguous room now; freeing older blocks will make room.
    Full,
    /// Larger than the whole arena: no amount of freeing helps.
    TooLarge { requested: u64, capacity: u64 },
}

#[derive(Clone, Copy, Debug)]
/// A ring allocator of intermediate buffers in an arena of `capacity` bytes:
/// blocks are freed in allocation order.
pub struct HeapRing {
    capacity: u64,
    head: u64,
    tail: u64,
    live: u64,
    used: u64,
}

/// Allocations are aligned to this many bytes.
pub const HEAP_ALIGN: u64 = 64;

impl HeapRing {
    /// An empty ring over `capacity` bytes.
    pub const fn new(capacity: u64) -> Self {
        HeapRing {
            capacity: capacity - capacity % HEAP_ALIGN,
            head: 0,
            tail: 0,
            live: 0,
            used: 0,
        }
    }

    /// Its size in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held by live blocks and wrap gaps.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// No block is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// A block of `len` bytes after the last one, if there is room.
    pub fn alloc(&mut self, len: u64) -> Result<HeapBlock, HeapError> {
        // A length within `HEAP_ALIGN` of `u64::MAX` has no aligned length
        // (rounding it up would overflow): larger than any ring.
        let aligned = len.checked_next_multiple_of(HEAP_ALIGN);
        let len = match aligned {
            Some(len) if len <= self.capacity => len,
            _ => {
                return Err(HeapError::TooLarge {
                    requested: aligned.unwrap_or(len),
                    capacity: self.capacity,
                })
            }
        };
        // An empty ring does not start over at 0: where a block goes
        // depends only on the requests before it, not on whether older
        // blocks were freed yet (runs that retire at other times place
        // blocks alike). Empty, `tail` = `head`: everything is free.
        let (offset, gap) = if self.live == 0 || self.head > self.tail {
            // Free space: [head, capacity) and [0, tail).
            if self.capacity - self.head >= len {
                (self.head, 0)
            } else if self.live == 0 {
                // Empty: from 0, with no older block behind a gap.
                self.tail = 0;
                (0, 0)
            } else if self.tail >= len {
                (0, self.capacity - self.head)
            } else {
                return Err(HeapError::Full);
            }
        } else if self.tail - self.head >= len {
            // Wrapped: free space is [head, tail); it may fill up exactly,
            // as `live` tells a full ring (head = tail) from an empty one.
            (self.head, 0)
        } else {
            return Err(HeapError::Full);
        };
        let end = offset + len;
        self.head = end;
        self.live += 1;
        self.used += len + gap;
        Ok(HeapBlock { offset, len })
    }

    /// Frees the oldest live block, which must be `block` (retirement order).
    #[inline(always)]
    pub fn free(&mut self, block: HeapBlock) {
        // Most tasks ask for no heap: freeing their empty block is one test,
        // and the ring's fields stay out of the caller's loop.
        if block.len != 0 {
            self.free_until(block.offset + block.len);
        }
    }

    /// Frees the oldest live block, which ends at `end`.
    #[inline(never)]
    fn free_until(&mut self, end: u64) {
        if self.live == 0 {
            return;
        }
        let freed = if end >= self.tail {
            end - self.tail
        } else {
            self.capacity - self.tail + end
        };
        self.tail = end;
        self.live -= 1;
        self.used = self.used.saturating_sub(freed);
        if self.live == 0 {
            // The newest block ended at `head`: nothing is held.
            (self.tail, self.used) = (self.head, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bump_wrap_and_gap_accounting() {
        let mut h = HeapRing::new(1024);
        let a = h.alloc(400).unwrap(); // 448 after alignment
        let b = h.alloc(400).unwrap(); // [448, 896)
        assert_eq!((a.offset, b.offset), (0, 448));
        assert_eq!(
            h.alloc(200),
            Err(HeapError::Full),
            "128 bytes left at the end, none at the start"
        );
        h.free(a);
        assert_eq!(h.used(), 448);
        let c = h.alloc(200).unwrap(); // 256 bytes: does not fit in [896, 1024): wraps to 0
        assert_eq!(c.offset, 0, "never straddles the wrap point");
        assert_eq!(
            h.used(),
            448 + 256 + 128,
            "the skipped 128 bytes count as used"
        );
        assert_eq!(
            h.alloc(256),
            Err(HeapError::Full),
            "[256, 448) is 192 bytes"
        );
        let d = h.alloc(100).unwrap();
        assert_eq!(d.offset, 256);
        h.free(b);
        assert_eq!(
            h.used(),
            256 + 128 + 128,
            "c, d, and the gap until c is freed"
        );
        h.free(c);
        assert_eq!(h.used(), 128, "freeing c releases the gap before it");
        h.free(d);
        assert_eq!(h.used(), 0);
        assert_eq!(
            h.alloc(1024).unwrap().offset,
            0,
            "an empty ring takes the whole arena"
        );
    }

    /// A request whose aligned length does not fit in 64 bits is too
    /// large, not a block of the wrapped-around length (0 bytes).
    #[test]
    fn a_request_near_u64_max_is_too_large() {
        let mut h = HeapRing::new(1024);
        for len in [u64::MAX, u64::MAX - 62] {
            assert_eq!(
                h.alloc(len),
                Err(HeapError::TooLarge {
                    requested: len,
                    capacity: 1024
                })
            );
        }
        assert_eq!(h.used(), 0, "nothing was allocated");
        assert_eq!(h.alloc(1024).unwrap().len, 1024, "the whole ring is free");
    }

    #[test]
    fn a_block_may_end_exactly_at_the_tail() {
        // Two halves: after the first is freed, a half fits exactly in
        // [0, tail) (the live count tells a full ring from an empty one).
        let mut h = HeapRing::new(1024);
        let a = h.alloc(512).unwrap();
        let b = h.alloc(512).unwrap();
        h.free(a);
        let c = h.alloc(512).unwrap();
        assert_eq!(c.offset, 0);
        assert_eq!(h.used(), 1024);
        assert_eq!(h.alloc(64), Err(HeapError::Full), "full: head meets tail");
        h.free(b);
        let d = h.alloc(512).unwrap();
        assert_eq!(d.offset, 512, "fits exactly between head and the end");
        h.free(c);
        h.free(d);
        assert_eq!(h.used(), 0);
    }

    #[test]
    fn where_a_block_goes_does_not_depend_on_when_older_ones_were_freed() {
        // The same requests, each block free to go as soon as it is taken
        // (its task retired), under two timings: freed at once, or only
        // when the ring is full. Every block lands at the same offset, so
        // runs whose retirements come at other times fill the arena alike.
        let lens = [300u64, 500, 200, 640, 64, 900, 128, 384, 700, 256, 512, 100];
        let place = |eager: bool| {
            let mut h = HeapRing::new(1024);
            let mut live: Vec<HeapBlock> = Vec::new();
            let mut freeable = 0; // blocks at the front that may be freed now
            let mut offsets = Vec::new();
            for &len in &lens {
                if eager {
                    while freeable > 0 {
                        h.free(live.remove(0));
                        freeable -= 1;
                    }
                }
                let b = loop {
                    match h.alloc(len) {
                        Ok(b) => break b,
                        Err(HeapError::Full) => {
                            assert!(freeable > 0, "{len}: full with nothing to free");
                            h.free(live.remove(0));
                            freeable -= 1;
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                };
                offsets.push(b.offset);
                live.push(b);
                freeable = live.len();
            }
            offsets
        };
        assert_eq!(place(true), place(false));
        // An empty ring that wraps holds only the new block.
        let mut h = HeapRing::new(1024);
        let a = h.alloc(640).unwrap();
        h.free(a);
        let b = h.alloc(640).unwrap();
        assert_eq!((b.offset, h.used()), (0, 640));
        h.free(b);
        assert_eq!(h.used(), 0);
    }

    #[test]
    fn too_large_is_not_full() {
        let mut h = HeapRing::new(1024);
        assert_eq!(
            h.alloc(2000),
            Err(HeapError::TooLarge {
                requested: 2048,
                capacity: 1024
            })
        );
    }

    #[test]
    fn many_rounds_stay_consistent() {
        let mut h = HeapRing::new(4096);
        let mut live = [HeapBlock::default(); 8];
        let (mut first, mut count) = (0usize, 0usize);
        let mut x = 12345u64;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = 1 + (x >> 33) % 1500;
            match h.alloc(len) {
                Ok(b) if count < 8 => {
                    // No live block overlaps the new one.
                    for i in 0..count {
                        let o = live[(first + i) % 8];
                        assert!(b.offset + b.len <= o.offset || o.offset + o.len <= b.offset);
                    }
                    live[(first + count) % 8] = b;
                    count += 1;
                }
                Ok(b) => {
                    h.free(live[first]);
                    live[first] = b;
                    first = (first + 1) % 8;
                }
                Err(HeapError::Full) => {
                    assert!(count > 0, "an empty ring fits anything up to its capacity");
                    h.free(live[first]);
                    first = (first + 1) % 8;
                    count -= 1;
                }
                Err(e) => panic!("{e:?}"),
            }
            assert!(h.used() <= h.capacity());
        }
    }
}
