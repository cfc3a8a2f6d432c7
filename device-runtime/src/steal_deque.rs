//! A fixed-capacity work-stealing deque of task ids (Chase-Lev): one owner
//! pushes and pops at the bottom (newest first), any thread steals single
//! tasks from the top (oldest first).
//!
//! The scheduler uses it as the dispatch queue of one scheduler thread (see
//! [`crate::sched`]): the dispatcher owns it and pushes the tasks it places
//! there; the thread takes them oldest first through [`StealDeque::steal`],
//! and so do idle threads when the policy lets them steal.
//!
//! It follows Lê, Pop, Cohen and Zappa Nardelli, "Correct and Efficient
//! Work-Stealing for Weak Memory Models" (PPoPP 2013), with two changes for
//! a runtime without `alloc`:
//! - the buffer never grows: a push into a full deque is refused
//!   ([`Full`]), which the dispatcher turns into the `READY_QUEUE_FULL`
//!   stall instead of allocating;
//! - slots are atomics, so a thief that reads a slot the owner is
//!   overwriting gets a stale value instead of undefined behaviour, and
//!   then loses the race on `top` and discards it. The owner overwrites
//!   slot `i % N` only after `top` has passed `i`, so any thief that read
//!   position `i` fails its compare-exchange.
//!
//! `top` and `bottom` are signed so that the owner's tentative
//! `bottom - 1` on an empty deque cannot wrap around.
//!
//! All atomics come from `crate::sync`, so the loom model check at the end
//! of this file runs the same code.

use crate::sync::{fence, AtomicBool, AtomicI64, AtomicU64, Ordering};

/// A push found the deque full; the task id is handed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full(pub u64);

/// The deque's owner end was claimed already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlreadyOwned;

/// What a steal attempt got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steal {
    /// The deque held nothing.
    Empty,
    /// Lost a race with the owner or another thief; the deque may still
    /// hold tasks.
    Retry,
    /// The oldest task.
    Task(u64),
    /// The oldest task is one the caller may not take ([`StealDeque::steal_if`]).
    Declined,
}

/// `N` slots (a power of two). Place it where the owner and the thieves can
/// all reach it (a `static` on the device).
#[repr(C, align(64))]
pub struct StealDeque<const N: usize> {
    /// Next position a thief takes.
    top: AtomicI64,
    /// Next position the owner pushes to; on its own cache line, since only
    /// the owner writes it and thieves read it.
    bottom: CacheLine<AtomicI64>,
    owner_claimed: AtomicBool,
    slots: [AtomicU64; N],
}

#[repr(align(64))]
struct CacheLine<T>(T);

impl<const N: usize> StealDeque<N> {
    const POWER_OF_TWO: () = assert!(
        N.is_power_of_two() && N <= i64::MAX as usize,
        "the deque's capacity must be a power of two"
    );

    /// An empty deque (`const`, so it can live in a `static`).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let _ = Self::POWER_OF_TWO;
        StealDeque {
            top: AtomicI64::new(0),
            bottom: CacheLine(AtomicI64::new(0)),
            owner_claimed: AtomicBool::new(false),
            slots: [const { AtomicU64::new(0) }; N],
        }
    }

    /// An empty deque (loom's atomics cannot be built in const context).
    #[cfg(loom)]
    pub fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let _ = Self::POWER_OF_TWO;
        StealDeque {
            top: AtomicI64::new(0),
            bottom: CacheLine(AtomicI64::new(0)),
            owner_claimed: AtomicBool::new(false),
            slots: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn slot(&self, position: i64) -> &AtomicU64 {
        &self.slots[(position as u64 % N as u64) as usize]
    }

    /// The owner end, once: only one thread may push and pop.
    pub fn claim_owner(&self) -> Result<Owner<'_, N>, AlreadyOwned> {
        if self.owner_claimed.swap(true, Ordering::Acquire) {
            return Err(AlreadyOwned);
        }
        let seen_top = self.top.load(Ordering::Acquire);
        let bottom = self.bottom.0.load(Ordering::Relaxed);
        Ok(Owner {
            deque: self,
            seen_top,
            bottom,
        })
    }

    /// Tasks in the deque at some recent moment (exact when no one else
    /// is changing it).
    pub fn len(&self) -> usize {
        let b = self.bottom.0.load(Ordering::Relaxed);
        let t = self.top.load(Ordering::Relaxed);
        (b - t).max(0) as usize
    }

    /// Whether it holds no task now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes the deque new again (positions back to 0, the owner end
    /// unclaimed) without rewriting its slots, which are read only at
    /// positions pushed since; the tasks it held are dropped (plain words,
    /// nothing to free). (`&mut`: no owner end or thief can be using it.)
    pub fn clear(&mut self) {
        self.top.store(0, Ordering::Relaxed);
        self.bottom.0.store(0, Ordering::Relaxed);
        self.owner_claimed.store(false, Ordering::Relaxed);
    }

    /// Most tasks it holds (`N`).
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Takes the oldest task, from any thread.
    pub fn steal(&self) -> Steal {
        self.steal_if(|_| true)
    }

    /// Takes the oldest task if `take(task)` says so ([`Steal::Declined`]
    /// if not: the deque is unchanged). `take` may see a stale value, one
    /// the owner is overwriting; the steal of such a value then fails
    /// (`Retry`) whatever `take` said, as in [`StealDeque::steal`].
    pub fn steal_if(&self, take: impl Fn(u64) -> bool) -> Steal {
        let t = self.top.load(Ordering::Acquire);
        // Orders the read of `top` before the read of `bottom` against the
        // owner's fence in `pop` (the store-load pair of the algorithm).
        fence(Ordering::SeqCst);
        let b = self.bottom.0.load(Ordering::Acquire);
        if t >= b {
            return Steal::Empty;
        }
        let task = self.slot(t).load(Ordering::Relaxed);
        if !take(task) {
            return Steal::Declined;
        }
        match self
            .top
            .compare_exchange(t, t + 1, Ordering::SeqCst, Ordering::Relaxed)
        {
            Ok(_) => Steal::Task(task),
            Err(_) => Steal::Retry,
        }
    }
}

impl<const N: usize> Default for StealDeque<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// The owner's end of a [`StealDeque`]: push and pop at the bottom.
pub struct Owner<'a, const N: usize> {
    deque: &'a StealDeque<N>,
    /// The owner's last reading of `top` (at or behind it: `top` only
    /// grows). Thieves write `top` as they take tasks, so reading it on
    /// every push fetched its line back from the last thief: a push reads
    /// it again only when this reading says the deque is full, and
    /// [`Owner::len_bound`] reads it not at all.
    seen_top: i64,
    /// The next position the owner writes: at or ahead of the published
    /// `bottom` ([`Owner::write`], [`Owner::publish`]).
    bottom: i64,
}

impl<const N: usize> Drop for Owner<'_, N> {
    /// Publishes what it wrote and gives the owner end back, so that a
    /// later run can claim it.
    fn drop(&mut self) {
        self.publish();
        self.deque.owner_claimed.store(false, Ordering::Release);
    }
}

impl<const N: usize> Owner<'_, N> {
    /// Adds a task at the bottom; refused when the deque holds `N` tasks.
    pub fn push(&mut self, task: u64) -> Result<(), Full> {
        self.write(task)?;
        self.publish();
        Ok(())
    }

    /// Adds a task at the bottom without showing it to thieves yet (see
    /// [`Owner::publish`]); refused when the deque holds `N` tasks. Tasks
    /// written in a row and published at once cost a thief that takes
    /// them one transfer of `bottom`'s line, not one per task.
    pub fn write(&mut self, task: u64) -> Result<(), Full> {
        let d = self.deque;
        let b = self.bottom;
        if b - self.seen_top >= N as i64 {
            // Full as last seen. Acquire: the thieves' reads of the slots
            // they took happen before the owner overwrites them (a stale
            // reading only refuses more: the slot of position `b` is
            // overwritten only once `top` has passed `b - N`).
            self.seen_top = d.top.load(Ordering::Acquire);
            if b - self.seen_top >= N as i64 {
                return Err(Full(task));
            }
        }
        d.slot(b).store(task, Ordering::Relaxed);
        self.bottom = b + 1;
        Ok(())
    }

    /// Shows thieves every task written so far.
    pub fn publish(&mut self) {
        let d = self.deque;
        if d.bottom.0.load(Ordering::Relaxed) != self.bottom {
            // The slots before the new bottom that makes them visible.
            fence(Ordering::Release);
            d.bottom.0.store(self.bottom, Ordering::Relaxed);
        }
    }

    /// Takes the newest task.
    pub fn pop(&mut self) -> Option<u64> {
        self.publish();
        let task = self.pop_published();
        self.bottom = self.deque.bottom.0.load(Ordering::Relaxed);
        task
    }

    fn pop_published(&mut self) -> Option<u64> {
        let d = self.deque;
        let b = d.bottom.0.load(Ordering::Relaxed) - 1;
        d.bottom.0.store(b, Ordering::Relaxed);
        // Orders the claim on `bottom` before the read of `top` (see `steal`).
        fence(Ordering::SeqCst);
        let t = d.top.load(Ordering::Relaxed);
        if t > b {
            // Empty: undo the claim.
            d.bottom.0.store(b + 1, Ordering::Relaxed);
            return None;
        }
        let task = d.slot(b).load(Ordering::Relaxed);
        if t < b {
            return Some(task);
        }
        // The last task: race the thieves for it through `top`.
        let won = d
            .top
            .compare_exchange(t, t + 1, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok();
        d.bottom.0.store(b + 1, Ordering::Relaxed);
        won.then_some(task)
    }

    /// Tasks it holds now (and a fresh reading of `top` for the owner).
    pub fn len(&mut self) -> usize {
        let d = self.deque;
        self.seen_top = self.seen_top.max(d.top.load(Ordering::Acquire));
        (self.bottom - self.seen_top).max(0) as usize
    }

    /// At least the tasks it holds now, without reading the thieves' end:
    /// what it held at the owner's last reading of `top`, plus what the
    /// owner pushed since.
    pub fn len_bound(&self) -> usize {
        (self.bottom - self.seen_top).max(0) as usize
    }

    /// Whether it holds no task now (written or published).
    pub fn is_empty(&self) -> bool {
        self.bottom <= self.deque.top.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn a_cleared_deque_is_new_again() {
        let mut d = StealDeque::<4>::new();
        {
            let mut o = d.claim_owner().unwrap();
            for t in 1..=2 {
                o.push(t).unwrap();
            }
            // Left claimed, as by a scheduler forgotten after a failed run.
            core::mem::forget(o);
        }
        d.clear();
        assert!(d.is_empty(), "the two tasks left are dropped");
        assert_eq!(d.steal(), Steal::Empty);
        let mut o = d.claim_owner().expect("the owner end is free again");
        for t in 5..=8 {
            o.push(t).unwrap();
        }
        assert!(o.push(9).is_err(), "four fit");
        assert_eq!(o.pop(), Some(8));
        drop(o);
        assert_eq!(d.top.load(Ordering::Relaxed), 0, "positions from 0");
    }

    #[test]
    fn the_owners_bound_counts_steals_only_once_it_reads_top() {
        let d = StealDeque::<8>::new();
        let mut o = d.claim_owner().unwrap();
        for t in 1..=3 {
            o.push(t).unwrap();
        }
        assert_eq!(d.steal(), Steal::Task(1));
        assert_eq!(d.steal(), Steal::Task(2));
        assert_eq!(o.len_bound(), 3, "two steals the owner has not read");
        assert_eq!(o.len(), 1);
        assert_eq!(o.len_bound(), 1, "read with the length");
        // A push into a deque full as last seen reads `top` again.
        for t in 4..=8 {
            o.push(t).unwrap();
        }
        assert_eq!(d.steal(), Steal::Task(3));
        assert_eq!(o.len_bound(), 6);
        for t in 9..=11 {
            o.push(t).unwrap();
        }
        assert_eq!(o.len(), 8);
        assert_eq!(o.push(12), Err(Full(12)));
    }

    #[test]
    fn owner_is_lifo_thieves_are_fifo_and_full_refuses() {
        let d = StealDeque::<4>::new();
        let mut o = d.claim_owner().unwrap();
        assert_eq!(d.claim_owner().err(), Some(AlreadyOwned));
        for t in 1..=4 {
            o.push(t).unwrap();
        }
        assert_eq!(
            o.push(5),
            Err(Full(5)),
            "a full deque refuses, it does not grow"
        );
        assert_eq!(d.steal(), Steal::Task(1));
        assert_eq!(o.pop(), Some(4));
        o.push(6).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d.steal(), Steal::Task(2));
        assert_eq!(o.pop(), Some(6));
        assert_eq!(o.pop(), Some(3));
        assert_eq!(o.pop(), None);
        assert_eq!(d.steal(), Steal::Empty);
        // A declined steal leaves the deque as it was.
        o.push(7).unwrap();
        o.push(8).unwrap();
        assert_eq!(d.steal_if(|t| t == 8), Steal::Declined);
        assert_eq!(d.len(), 2);
        assert_eq!(d.steal_if(|t| t == 7), Steal::Task(7));
        assert_eq!(d.steal_if(|_| false), Steal::Declined);
        assert_eq!(o.pop(), Some(8));
        assert_eq!(d.steal_if(|_| true), Steal::Empty);
        // Positions keep growing past the capacity; slots wrap.
        for round in 0..10u64 {
            for t in 0..4 {
                o.push(round * 4 + t).unwrap();
            }
            for t in 0..4 {
                assert_eq!(d.steal(), Steal::Task(round * 4 + t));
            }
        }
        assert!(d.is_empty());
    }

    /// One owner pushing and popping, three thieves: every task is taken
    /// exactly once.
    #[test]
    fn every_task_is_taken_exactly_once_under_contention() {
        const TASKS: u64 = 200_000;
        let d = Arc::new(StealDeque::<64>::new());
        let taken: Arc<Vec<AtomicUsize>> =
            Arc::new((0..TASKS).map(|_| AtomicUsize::new(0)).collect());
        let done = Arc::new(AtomicBool::new(false));
        let thieves: Vec<_> = (0..3)
            .map(|_| {
                let (d, taken, done) = (d.clone(), taken.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut stolen = 0u64;
                    loop {
                        match d.steal() {
                            Steal::Task(t) => {
                                taken[t as usize].fetch_add(1, Ordering::Relaxed);
                                stolen += 1;
                            }
                            Steal::Retry | Steal::Declined => {}
                            Steal::Empty if done.load(Ordering::Acquire) => return stolen,
                            Steal::Empty => std::hint::spin_loop(),
                        }
                    }
                })
            })
            .collect();
        let mut o = d.claim_owner().unwrap();
        let mut popped = 0u64;
        for t in 0..TASKS {
            while o.push(t).is_err() {
                if let Some(x) = o.pop() {
                    taken[x as usize].fetch_add(1, Ordering::Relaxed);
                    popped += 1;
                }
            }
            if t % 3 == 0 {
                if let Some(x) = o.pop() {
                    taken[x as usize].fetch_add(1, Ordering::Relaxed);
                    popped += 1;
                }
            }
        }
        while let Some(x) = o.pop() {
            taken[x as usize].fetch_add(1, Ordering::Relaxed);
            popped += 1;
        }
        done.store(true, Ordering::Release);
        let stolen: u64 = thieves.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(popped + stolen, TASKS);
        for (t, n) in taken.iter().enumerate() {
            assert_eq!(n.load(Ordering::Relaxed), 1, "task {t}");
        }
    }
}

/// Model check: every interleaving of the owner and two thieves over a
/// deque of two slots, including the race for the last task and a push
/// into a full deque.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// A thread that tries `tries` steals from `d`; joins with what it got.
    fn thief(d: &Arc<StealDeque<2>>, tries: usize) -> loom::thread::JoinHandle<Vec<u64>> {
        let d = d.clone();
        loom::thread::spawn(move || {
            let mut got = Vec::new();
            for _ in 0..tries {
                if let Steal::Task(t) = d.steal() {
                    got.push(t);
                }
            }
            got
        })
    }

    /// Owner pushes past capacity and pops while a thief steals twice.
    #[test]
    fn each_task_is_taken_once_in_every_interleaving() {
        loom::model(|| {
            let d = Arc::new(StealDeque::<2>::new());
            let thief = thief(&d, 2);
            let mut o = d.claim_owner().unwrap();
            let mut all = Vec::new();
            o.push(1).unwrap();
            o.push(2).unwrap();
            if o.push(3).is_err() {
                // Full: taking one makes room.
                all.extend(o.pop());
                o.push(3).unwrap();
            }
            while let Some(t) = o.pop() {
                all.push(t);
            }
            all.extend(thief.join().unwrap());
            all.sort();
            assert_eq!(all, vec![1, 2, 3], "each task exactly once");
        });
    }

    /// Tasks written in a row and published at once, past a full deque
    /// as last seen, reach a thief with their values, each once.
    #[test]
    fn tasks_published_together_are_each_stolen_once() {
        loom::model(|| {
            let d = Arc::new(StealDeque::<2>::new());
            let mut o = d.claim_owner().unwrap();
            o.write(1).unwrap();
            o.write(2).unwrap();
            o.publish();
            let thief = thief(&d, 3);
            // Full as last seen: the write reads `top` again, and goes in
            // once the thief has taken one.
            let mut all = Vec::new();
            if o.write(3).is_ok() {
                o.publish();
            } else {
                all.push(3);
            }
            all.extend(thief.join().unwrap());
            while let Some(t) = o.pop() {
                all.push(t);
            }
            all.sort();
            assert_eq!(all, vec![1, 2, 3], "each task exactly once");
        });
    }

    /// Two thieves and the owner race for the last task: one wins.
    #[test]
    fn the_last_task_goes_to_exactly_one_taker() {
        loom::model(|| {
            let d = Arc::new(StealDeque::<2>::new());
            let mut o = d.claim_owner().unwrap();
            o.push(7).unwrap();
            let thieves: Vec<_> = (0..2)
                .map(|_| {
                    let d = d.clone();
                    loom::thread::spawn(move || match d.steal() {
                        Steal::Task(t) => Some(t),
                        Steal::Empty | Steal::Retry | Steal::Declined => None,
                    })
                })
                .collect();
            let mut all: Vec<u64> = o.pop().into_iter().collect();
            for t in thieves {
                all.extend(t.join().unwrap());
            }
            assert_eq!(all, vec![7], "the task exactly once");
        });
    }

    /// A thief that takes only some tasks (`steal_if`, as a thread does for
    /// tasksets whose policy does not steal) never takes another, and
    /// every task is still taken exactly once.
    #[test]
    fn a_selective_thief_takes_only_what_it_may() {
        loom::model(|| {
            let d = Arc::new(StealDeque::<2>::new());
            let mut o = d.claim_owner().unwrap();
            o.push(1).unwrap();
            o.push(2).unwrap();
            let thief = {
                let d = d.clone();
                loom::thread::spawn(move || {
                    let mut got = Vec::new();
                    for _ in 0..2 {
                        if let Steal::Task(t) = d.steal_if(|t| t == 2) {
                            got.push(t);
                        }
                    }
                    got
                })
            };
            let mut all: Vec<u64> = o.pop().into_iter().collect();
            all.extend(o.pop());
            let stolen = thief.join().unwrap();
            assert!(stolen.iter().all(|&t| t == 2), "{stolen:?}");
            all.extend(stolen);
            all.sort();
            assert_eq!(all, vec![1, 2], "each task exactly once");
        });
    }
}
