//! The release graph: fan-in counters and fan-out lists that scheduler
//! threads release concurrently while the orchestrator adds tasks.
//!
//! The orchestrator ([`Orchestrator::submit_linked`](super::Orchestrator::submit_linked))
//! infers a task's producers as always, then links the task into each
//! producer's fan-out list here instead of its own DepList pool. Whichever
//! thread observes a producer's completion calls [`ReleaseGraph::complete`]:
//! it closes the producer's list, walks it and drops one from each
//! consumer's fan-in; the thread that brings a fan-in to zero owns the
//! task and queues it. So a completion never travels back to the
//! orchestrator's thread before its dependents can run: the orchestrator
//! only learns of it later, to retire the task and reclaim its resources.
//!
//! The protocol, per task slot (the task's id modulo `TASKS`):
//! - [`open`](ReleaseGraph::open): the orchestrator resets the slot, its
//!   fan-in at [`BIAS`] so that no completion can release it while it is
//!   being linked;
//! - [`link`](ReleaseGraph::link): pushes an edge onto a producer's list
//!   with a compare-and-swap that fails once the producer's completer has
//!   closed the list (then there is no edge: the producer is done);
//! - [`arm`](ReleaseGraph::arm): takes the bias back minus the edges it
//!   linked, in one atomic step; the task is ready now if every linked
//!   producer has already completed;
//! - [`complete`](ReleaseGraph::complete) and [`issued`](ReleaseGraph::issued)
//!   (the stream edge, released when the stream's previous task is issued
//!   rather than completed): drop fan-ins, report the tasks they release.
//!
//! Only the orchestrator's thread links (one writer of edges); completers
//! only close. Edge nodes live in a ring that the orchestrator allocates
//! in submission order and reclaims when the consumer that owns them
//! retires: a producer's list is walked before any of its consumers can
//! run, so a node is never read after its consumer retired. A completer
//! reads a node's successor before it releases the node's consumer.
//!
//! Everything is atomics over the crate's swappable `sync` module, so loom model-checks the
//! protocol (`RUSTFLAGS="--cfg loom" cargo test -p device-runtime --release loom`).

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// A fan-in while the orchestrator links the task: larger than any number
/// of edges, so completers cannot bring it to zero before [`ReleaseGraph::arm`].
pub const BIAS: u32 = 1 << 30;

/// Marks a fan-out list as closed: its producer completed.
const CLOSED: u32 = 1 << 31;
/// The end of a fan-out list.
const NIL: u32 = CLOSED - 1;
/// No task waits for this one's issue on its stream.
const NO_NEXT: u32 = u32::MAX;
/// The task was issued: a stream successor linked now would wait forever.
const ISSUED: u32 = u32::MAX - 1;

/// One task slot's words that releasers write: its fan-in and tag.
/// Apart from its fan-out list ([`Links`]): a thread that releases the
/// task as a consumer would otherwise pull the line the orchestrator
/// links later consumers into when the task is their producer (a
/// whole-tensor task linked into each of a round of tile tasks that a
/// thread had just released found every one of their lines on that
/// thread).
#[repr(align(16))]
struct Fanin {
    /// Unfinished producers (plus [`BIAS`] while linking).
    fanin: AtomicU32,
    /// The caller's value for the task, handed to whoever releases it.
    tag: AtomicU64,
}
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<Fanin>() == 16);

/// One task slot's words that the orchestrator links into and the
/// task's completer (or issuer) closes.
#[repr(align(16))]
struct Links {
    /// Head edge of the fan-out list, with [`CLOSED`] once completed.
    fanout: AtomicU32,
    /// The slot of the stream's next task, [`NO_NEXT`] or [`ISSUED`].
    stream_next: AtomicU32,
    /// Another value of the caller's for the task, that the graph does not
    /// use (the dispatcher's dispatch key): it fills the 16 bytes.
    key: AtomicU64,
}
#[cfg(not(loom))]
const _: () = assert!(core::mem::size_of::<Links>() == 16);

/// One fan-out edge, in one word (4 bytes an edge, so that the graph can
/// hold four edges per task of the window in the space two took): the
/// consumer's slot in the low bits (see [`ReleaseGraph::SLOT_BITS`]), the
/// next edge of the producer's list above them ([`ReleaseGraph::EDGE_NIL`]
/// at the end). The orchestrator writes it before it pushes the edge, and
/// a completer reads it after it closes the list, so the word needs no
/// ordering of its own.
struct Edge {
    word: AtomicU32,
}

crate::sync::maybe_const_fn! {
    fn new_fanin() -> Fanin {
        Fanin {
            fanin: AtomicU32::new(0),
            tag: AtomicU64::new(0),
        }
    }
}

crate::sync::maybe_const_fn! {
    /// Zeros: a slot's links are read only after [`ReleaseGraph::open`]
    /// (every slot is opened for its task before any edge to or from it,
    /// which is also why `Queues::reset` leaves the graph alone), and an
    /// all-zero graph lets a `static` of the dispatch queues live in
    /// `.bss` instead of the firmware image (827 KiB of its `.data` were
    /// these words' first values).
    fn new_links() -> Links {
        Links {
            fanout: AtomicU32::new(0),
            stream_next: AtomicU32::new(0),
            key: AtomicU64::new(0),
        }
    }
}

crate::sync::maybe_const_fn! {
    fn new_edge() -> Edge {
        Edge {
            word: AtomicU32::new(0),
        }
    }
}

/// Fan-in and fan-out of `TASKS` task slots, with `EDGES` edge nodes
/// (32 bytes per slot, 4 per edge).
pub struct ReleaseGraph<const TASKS: usize, const EDGES: usize> {
    fanins: [Fanin; TASKS],
    links: [Links; TASKS],
    edges: [Edge; EDGES],
}

impl<const TASKS: usize, const EDGES: usize> ReleaseGraph<TASKS, EDGES> {
    /// Bits of an edge word that hold the consumer's slot.
    const SLOT_BITS: u32 = usize::BITS - (TASKS.saturating_sub(1)).leading_zeros();
    /// The next-edge field of an edge word at the end of its list.
    const EDGE_NIL: u32 = u32::MAX >> Self::SLOT_BITS;
    const FITS: () = assert!(
        TASKS < NO_NEXT as usize - 1 && EDGES < NIL as usize && EDGES < Self::EDGE_NIL as usize,
        "slot and edge numbers must fit below the markers and an edge in one word"
    );

    /// The word of an edge to `consumer` before list head `head` (an edge
    /// or [`NIL`]).
    #[inline(always)]
    fn edge_word(consumer: usize, head: u32) -> u32 {
        debug_assert!(consumer < TASKS, "a slot fits the word's low bits");
        let next = if head == NIL { Self::EDGE_NIL } else { head };
        consumer as u32 | next << Self::SLOT_BITS
    }

    /// The consumer slot and the next edge (or [`NIL`]) of an edge word.
    #[inline(always)]
    fn edge_of(word: u32) -> (usize, u32) {
        let consumer = (word & ((1u64 << Self::SLOT_BITS) - 1) as u32) as usize;
        let next = word >> Self::SLOT_BITS;
        (consumer, if next == Self::EDGE_NIL { NIL } else { next })
    }

    /// An empty graph (`const`, so that it can live in a `static`).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let _ = Self::FITS;
        ReleaseGraph {
            fanins: [const { new_fanin() }; TASKS],
            links: [const { new_links() }; TASKS],
            edges: [const { new_edge() }; EDGES],
        }
    }

    /// An empty graph (loom's atomics cannot be built in const context).
    /// An empty graph (under loom, whose atomics are not `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let _ = Self::FITS;
        ReleaseGraph {
            fanins: core::array::from_fn(|_| new_fanin()),
            links: core::array::from_fn(|_| new_links()),
            edges: core::array::from_fn(|_| new_edge()),
        }
    }

    /// Orchestrator: resets `slot` for a new task with `tag`, before any
    /// edge to or from it. Its previous task must have completed, and its
    /// releases and issue must be done (it retired).
    pub fn open(&self, slot: usize, tag: u64) {
        let (f, l) = (&self.fanins[slot], &self.links[slot]);
        f.fanin.store(BIAS, Ordering::Relaxed);
        f.tag.store(tag, Ordering::Relaxed);
        l.fanout.store(NIL, Ordering::Relaxed);
        l.stream_next.store(NO_NEXT, Ordering::Relaxed);
    }

    /// Sets `slot`'s [`key`](Self::key): the caller's, for the task the slot
    /// holds next or now, kept until it sets another. No other thread reads
    /// it (`Relaxed`).
    pub fn set_key(&self, slot: usize, key: u64) {
        self.links[slot].key.store(key, Ordering::Relaxed);
    }

    /// The value [`set_key`](Self::set_key) last set for `slot`.
    pub fn key(&self, slot: usize) -> u64 {
        self.links[slot].key.load(Ordering::Relaxed)
    }

    /// Orchestrator: makes `consumer` wait for `producer`'s completion
    /// through edge node `edge` (unused by any live consumer). `false` if
    /// the producer has already completed: then there is no edge and the
    /// node stays free.
    pub fn link(&self, producer: usize, consumer: usize, edge: usize) -> bool {
        let node = &self.edges[edge];
        let list = &self.links[producer].fanout;
        let mut head = list.load(Ordering::Relaxed);
        loop {
            if head & CLOSED != 0 {
                return false;
            }
            node.word
                .store(Self::edge_word(consumer, head), Ordering::Relaxed);
            // Release: the node's word and the consumer's slot (written
            // by `open`) before the completer that closes this list.
            match list.compare_exchange_weak(
                head,
                edge as u32,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                // Closed meanwhile, or a spurious failure: look again.
                Err(now) => head = now,
            }
        }
    }

    /// Orchestrator: makes `consumer` wait until the stream's previous task
    /// `before` is issued. `false` if it already was.
    pub fn link_stream(&self, before: usize, consumer: usize) -> bool {
        self.links[before]
            .stream_next
            .compare_exchange(
                NO_NEXT,
                consumer as u32,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Orchestrator: ends linking `slot`, which got `linked` edges (its
    /// producers and stream predecessor that had not finished). `true` if
    /// it is ready now (they have all finished meanwhile): the caller
    /// queues it. Otherwise the last of them to finish releases it.
    pub fn arm(&self, slot: usize, linked: u32) -> bool {
        debug_assert!(linked < BIAS);
        let take = BIAS - linked;
        self.fanins[slot].fanin.fetch_sub(take, Ordering::AcqRel) == take
    }

    /// Drops one from `slot`'s fan-in; at zero, hands its tag to `ready`.
    #[inline(always)]
    fn release(&self, slot: usize, ready: &mut impl FnMut(u64)) {
        let s = &self.fanins[slot];
        // AcqRel: the last releaser sees every producer's completion (and
        // their kernels' writes, which each completer acquired by polling).
        if s.fanin.fetch_sub(1, Ordering::AcqRel) == 1 {
            ready(s.tag.load(Ordering::Relaxed));
        }
    }

    /// Any thread: the task in `slot` completed. Closes its fan-out list
    /// and hands the tag of every consumer it was the last producer of to
    /// `ready`. Exactly once per task.
    pub fn complete(&self, slot: usize, mut ready: impl FnMut(u64)) {
        // Acquire: the edges the orchestrator pushed, and their consumers' slots.
        let head = self.links[slot].fanout.fetch_or(CLOSED, Ordering::AcqRel);
        debug_assert!(head & CLOSED == 0, "a task completes once");
        let mut edge = head & !CLOSED;
        while edge != NIL {
            // Before the release: once released, the consumer may run and
            // retire, and its nodes be reused.
            let (consumer, next) =
                Self::edge_of(self.edges[edge as usize].word.load(Ordering::Relaxed));
            edge = next;
            self.release(consumer, &mut ready);
        }
    }

    /// The thread that issued the task in `slot` to a core: lets the next
    /// task of its stream go (handing its tag to `ready` if that was its
    /// last wait). Once per task on a stream, before its completion.
    pub fn issued(&self, slot: usize, mut ready: impl FnMut(u64)) {
        let next = self.links[slot].stream_next.swap(ISSUED, Ordering::AcqRel);
        if next != NO_NEXT && next != ISSUED {
            self.release(next as usize, &mut ready);
        }
    }

    /// Whether the task in `slot` has been released (its fan-in reached
    /// zero): it is queued, running or done, as far as this thread sees.
    pub fn released(&self, slot: usize) -> bool {
        self.fanins[slot].fanin.load(Ordering::Acquire) == 0
    }

    /// Orchestrator (for reports): whether the task in `producer` has not
    /// completed and `consumer` waits for it, by an edge or on its stream.
    pub fn waits_for(&self, consumer: usize, producer: usize) -> bool {
        let p = &self.links[producer];
        if p.stream_next.load(Ordering::Acquire) == consumer as u32 {
            return true;
        }
        let head = p.fanout.load(Ordering::Acquire);
        if head & CLOSED != 0 {
            return false;
        }
        let mut edge = head;
        let mut steps = 0;
        while edge != NIL && steps < EDGES {
            let (to, next) = Self::edge_of(self.edges[edge as usize].word.load(Ordering::Relaxed));
            if to == consumer {
                return true;
            }
            edge = next;
            steps += 1;
        }
        false
    }
}

#[cfg(not(loom))]
impl<const TASKS: usize, const EDGES: usize> Default for ReleaseGraph<TASKS, EDGES> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::vec::Vec;

    use super::*;

    type Graph = ReleaseGraph<8, 16>;

    fn released(f: impl FnOnce(&mut dyn FnMut(u64))) -> Vec<u64> {
        let mut out = Vec::new();
        f(&mut |tag| out.push(tag));
        out
    }

    #[test]
    fn a_task_is_ready_when_its_last_producer_completes() {
        let g = Graph::new();
        g.open(0, 100);
        assert!(g.arm(0, 0), "no producers: ready at once");
        g.open(1, 101);
        assert!(g.arm(1, 0));
        g.open(2, 102);
        assert!(g.link(0, 2, 0));
        assert!(g.link(1, 2, 1));
        assert!(!g.arm(2, 2));
        assert!(g.waits_for(2, 0) && g.waits_for(2, 1));
        assert_eq!(released(|r| g.complete(1, r)), [] as [u64; 0]);
        assert!(!g.released(2));
        assert_eq!(released(|r| g.complete(0, r)), [102]);
        assert!(g.released(2));
        assert!(!g.waits_for(2, 0), "a completed producer holds no one");
    }

    #[test]
    fn a_fan_out_list_keeps_every_consumer_in_the_packed_edge_words() {
        // The highest slot and edge numbers use every bit of an edge
        // word's two fields; edge 0 and slot 0 use none.
        let g = Graph::new();
        g.open(0, 1000);
        assert!(g.arm(0, 0));
        for (consumer, edge) in [(7, 15), (1, 0), (6, 14), (3, 8)] {
            g.open(consumer, 1000 + consumer as u64);
            assert!(g.link(0, consumer, edge));
            assert!(!g.arm(consumer, 1));
            assert!(g.waits_for(consumer, 0));
        }
        assert!(!g.waits_for(2, 0), "slot 2 was never linked");
        let mut got = released(|r| g.complete(0, r));
        got.sort_unstable();
        assert_eq!(got, [1001, 1003, 1006, 1007]);
    }

    #[test]
    fn a_producer_that_completed_gets_no_edge() {
        let g = Graph::new();
        g.open(0, 7);
        assert!(g.arm(0, 0));
        assert!(released(|r| g.complete(0, r)).is_empty());
        g.open(1, 8);
        assert!(!g.link(0, 1, 0), "closed list");
        assert!(g.arm(1, 0));
    }

    #[test]
    fn completions_during_linking_release_at_arm() {
        let g = Graph::new();
        for s in 0..3 {
            g.open(s, s as u64);
            assert!(g.arm(s, 0));
        }
        g.open(3, 3);
        assert!(g.link(0, 3, 0) && g.link(1, 3, 1) && g.link(2, 3, 2));
        // All three finish before the orchestrator arms the task: the
        // bias keeps it from being released by a completer ...
        for s in 0..3 {
            assert!(released(|r| g.complete(s, r)).is_empty());
        }
        // ... and arming finds it ready.
        assert!(g.arm(3, 3));
    }

    #[test]
    fn a_stream_successor_waits_for_the_issue_only() {
        let g = Graph::new();
        g.open(0, 10);
        assert!(g.arm(0, 0));
        g.open(1, 11);
        assert!(g.link_stream(0, 1));
        assert!(!g.arm(1, 1));
        assert!(g.waits_for(1, 0));
        assert_eq!(released(|r| g.issued(0, r)), [11]);
        // After the issue, a later stream task does not wait for it.
        g.open(2, 12);
        assert!(!g.link_stream(0, 2));
        assert!(g.arm(2, 0));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use std::vec::Vec;

    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// A consumer of two producers that complete on two threads while the
    /// orchestrator links it: it is released exactly once, by whoever
    /// sees its last producer finish (or by `arm`).
    #[test]
    fn loom_link_races_completions() {
        loom::model(|| {
            let g = Arc::new(ReleaseGraph::<4, 4>::new());
            for s in 0..2 {
                g.open(s, s as u64);
                assert!(g.arm(s, 0));
            }
            let done: Vec<_> = (0..2)
                .map(|s| {
                    let g = g.clone();
                    thread::spawn(move || {
                        let mut n = 0;
                        g.complete(s, |tag| {
                            assert_eq!(tag, 9);
                            n += 1;
                        });
                        n
                    })
                })
                .collect();
            g.open(2, 9);
            let linked = g.link(0, 2, 0) as u32 + g.link(1, 2, 1) as u32;
            let mut releases = g.arm(2, linked) as u32;
            for t in done {
                releases += t.join().unwrap();
            }
            assert_eq!(releases, 1);
        });
    }

    /// The stream edge against the issue on another thread.
    #[test]
    fn loom_stream_link_races_issue() {
        loom::model(|| {
            let g = Arc::new(ReleaseGraph::<4, 4>::new());
            g.open(0, 0);
            assert!(g.arm(0, 0));
            let issuer = {
                let g = g.clone();
                thread::spawn(move || {
                    let mut n = 0;
                    g.issued(0, |_| n += 1);
                    n
                })
            };
            g.open(1, 1);
            let linked = g.link_stream(0, 1) as u32;
            let releases = g.arm(1, linked) as u32 + issuer.join().unwrap();
            assert_eq!(releases, 1);
        });
    }
}
