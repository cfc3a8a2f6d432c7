//! A bounded single-producer single-consumer ring of `u64`s: how a
//! scheduler thread hands the ids of finished tasks back to the dispatcher.
//!
//! Slots are atomics, so the ring needs no `unsafe`: the producer stores a
//! slot and then publishes the new tail with Release; the consumer reads
//! the tail with Acquire, then the slot, then frees it by publishing the new
//! head with Release, which the producer reads with Acquire before reusing
//! the slot. A second producer or consumer would lose values but cannot
//! cause undefined behaviour; the scheduler gives each end to one thread.
//!
//! Why not `heapless::spsc::Queue`: its ends come from `split(&mut self)`,
//! borrowed for as long as they live, while the rings live in the shared
//! [`Queues`](super::Queues) and each run takes its ends anew; its atomics
//! are not `crate::sync`'s, so the loom model check could not cover it;
//! and it is not faster. `cargo bench -p device-runtime --bench ring`
//! (512 slots, 5M values, medians of 7, a shared 2-core machine): push
//! then pop on one thread 0.71 ns per value here, 2.36 for the queue; from
//! one thread to another 65.3 ns here, 62.2 for the queue (within the
//! noise of that machine).

use crate::sync::{AtomicU64, Ordering};

/// `N` slots (a power of two).
///
/// Each end keeps, on its own cache line, the last value it read of the
/// other end's position, and reads the other end's line again only when
/// that stale view says the ring is full (producer) or empty (consumer):
/// a value then costs one transfer of its slot's line and, in bursts,
/// rarely one of a position's.
#[repr(C, align(64))]
pub struct Ring<const N: usize> {
    /// Next position the consumer reads, and the consumer's view of `tail`.
    head: Line<Position>,
    /// Next position the producer writes, and the producer's view of `head`.
    tail: Line<Position>,
    slots: [AtomicU64; N],
}

/// One end's position and its last reading of the other end's.
struct Position {
    at: AtomicU64,
    /// Only this end reads and writes it (`Relaxed`).
    seen: AtomicU64,
}

#[repr(align(64))]
struct Line<T>(T);

crate::sync::maybe_const_fn! {
    fn position() -> Line<Position> {
        Line(Position {
            at: AtomicU64::new(0),
            seen: AtomicU64::new(0),
        })
    }
}

impl<const N: usize> Ring<N> {
    const POWER_OF_TWO: () = assert!(N.is_power_of_two(), "ring capacity must be a power of two");

    /// An empty ring (`const`, so it can live in a `static`).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let _ = Self::POWER_OF_TWO;
        Ring {
            head: position(),
            tail: position(),
            slots: [const { AtomicU64::new(0) }; N],
        }
    }

    /// An empty ring (loom's atomics cannot be built in const context).
    #[cfg(loom)]
    pub fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let _ = Self::POWER_OF_TWO;
        Ring {
            head: position(),
            tail: position(),
            slots: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn slot(&self, position: u64) -> &AtomicU64 {
        &self.slots[(position % N as u64) as usize]
    }

    /// Producer: appends `value`; `false` (and nothing changes) when full.
    pub fn push(&self, value: u64) -> bool {
        let end = &self.tail.0;
        let tail = end.at.load(Ordering::Relaxed);
        if tail - end.seen.load(Ordering::Relaxed) >= N as u64 {
            // Full as last seen: look at the consumer's position again.
            let head = self.head.0.at.load(Ordering::Acquire);
            end.seen.store(head, Ordering::Relaxed);
            if tail - head >= N as u64 {
                return false;
            }
        }
        self.slot(tail).store(value, Ordering::Relaxed);
        end.at.store(tail + 1, Ordering::Release);
        true
    }

    /// Producer: whether `n` more values fit. Reads the consumer's position
    /// only when its last reading leaves too little room (that reading is
    /// at or behind the consumer, so the answer errs towards "no"): a
    /// check each round would otherwise pull the consumer's line over
    /// after every value it took.
    pub fn has_room(&self, n: usize) -> bool {
        let end = &self.tail.0;
        let tail = end.at.load(Ordering::Relaxed);
        if tail - end.seen.load(Ordering::Relaxed) + n as u64 <= N as u64 {
            return true;
        }
        let head = self.head.0.at.load(Ordering::Acquire);
        end.seen.store(head, Ordering::Relaxed);
        tail - head + n as u64 <= N as u64
    }

    /// Consumer: the oldest value, if any.
    pub fn pop(&self) -> Option<u64> {
        let end = &self.head.0;
        let head = end.at.load(Ordering::Relaxed);
        if head == end.seen.load(Ordering::Relaxed) {
            // Empty as last seen: look at the producer's position again.
            let tail = self.tail.0.at.load(Ordering::Acquire);
            end.seen.store(tail, Ordering::Relaxed);
            if head == tail {
                return None;
            }
        }
        let value = self.slot(head).load(Ordering::Relaxed);
        end.at.store(head + 1, Ordering::Release);
        Some(value)
    }

    /// Values in the ring at some recent moment.
    pub fn len(&self) -> usize {
        let tail = self.tail.0.at.load(Ordering::Acquire);
        let head = self.head.0.at.load(Ordering::Acquire);
        tail.saturating_sub(head) as usize
    }

    /// Whether it held nothing at some recent moment.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes the ring new again (both ends' positions and readings back
    /// to 0) without rewriting its slots, which are read only at positions
    /// pushed since; the values it held are dropped (plain words, nothing
    /// to free). (`&mut`: neither end can be using it.)
    pub fn clear(&mut self) {
        for end in [&self.head.0, &self.tail.0] {
            end.at.store(0, Ordering::Relaxed);
            end.seen.store(0, Ordering::Relaxed);
        }
    }
}

impl<const N: usize> Default for Ring<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_cleared_ring_is_new_again() {
        let mut r = Ring::<4>::new();
        for v in 0..3 {
            assert!(r.push(v));
        }
        assert_eq!(r.pop(), Some(0));
        r.clear();
        assert!(r.is_empty(), "the two values left are dropped");
        // New again: four values fit, and come out in order.
        for v in 10..14 {
            assert!(r.push(v));
        }
        assert!(!r.push(99));
        assert_eq!([r.pop(), r.pop()], [Some(10), Some(11)]);
        assert_eq!(r.head.0.at.load(Ordering::Relaxed), 2, "positions from 0");
    }

    #[test]
    fn fifo_full_and_wrap() {
        let r = Ring::<4>::new();
        for round in 0..3u64 {
            for v in 0..4 {
                assert!(r.push(round * 10 + v));
            }
            assert!(!r.push(99), "full ring refuses");
            assert_eq!(r.len(), 4);
            for v in 0..4 {
                assert_eq!(r.pop(), Some(round * 10 + v));
            }
            assert_eq!(r.pop(), None);
        }
    }

    #[test]
    fn room_counts_what_the_consumer_took() {
        let r = Ring::<4>::new();
        assert!(r.has_room(4) && !r.has_room(5));
        for v in 0..3 {
            assert!(r.push(v));
        }
        assert!(r.has_room(1) && !r.has_room(2), "three of four slots taken");
        assert_eq!(r.pop(), Some(0));
        assert_eq!(r.pop(), Some(1));
        // The producer's last reading was before the pops: it looks again.
        assert!(r.has_room(3) && !r.has_room(4));
        assert!(r.push(3) && r.push(4) && r.push(5));
        assert!(!r.has_room(1), "full");
    }

    #[test]
    fn two_threads_pass_every_value_in_order() {
        let r = Ring::<8>::new();
        const COUNT: u64 = 200_000;
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut v = 0;
                while v < COUNT {
                    if r.push(v) {
                        v += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
            });
            let mut expect = 0;
            while expect < COUNT {
                match r.pop() {
                    Some(v) => {
                        assert_eq!(v, expect);
                        expect += 1;
                    }
                    None => std::thread::yield_now(),
                }
            }
        });
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Every value arrives once and in order, also when the ring wraps, and
    /// room the producer sees is there when it pushes.
    #[test]
    fn values_arrive_once_in_order_in_every_interleaving() {
        loom::model(|| {
            let r = Arc::new(Ring::<2>::new());
            let producer = {
                let r = r.clone();
                loom::thread::spawn(move || {
                    let mut v = 1;
                    while v <= 3 {
                        // Room the producer sees stays: only it fills slots.
                        if r.has_room(1) {
                            assert!(r.push(v), "room was seen");
                            v += 1;
                        } else {
                            loom::thread::yield_now();
                        }
                    }
                })
            };
            let mut expect = 1;
            while expect <= 3 {
                match r.pop() {
                    Some(v) => {
                        assert_eq!(v, expect);
                        expect += 1;
                    }
                    None => loom::thread::yield_now(),
                }
            }
            producer.join().unwrap();
        });
    }
}
