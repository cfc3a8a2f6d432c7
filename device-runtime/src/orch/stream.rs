//! Streams and events: the orchestrator's bookkeeping for them.
//!
//! - A task submitted on a stream is held back (one count in its fan-in)
//!   until the stream's previous task has been *issued* to a core
//!   ([`Orchestrator::issued`](super::Orchestrator::issued)), so a stream's
//!   tasks are issued in submission order, whichever scheduler thread
//!   issues them, yet may run at the same time. The edge is a field of the
//!   older task's slot, not a DepList node: a task has at most one stream
//!   successor, so streams never stall on the DepList pool.
//! - Recording an event on a stream remembers the stream and the id of the
//!   next submission: the event stands for the stream's tasks below that id.
//! - Waiting on an event from a stream makes the stream's next task depend
//!   (through ordinary DepList edges) on each of those tasks still live.
//!   Later tasks of the stream are issued after that one, so they wait too.
//!   Several waits before the next task are merged per source stream: a
//!   wait for the tasks below a larger id covers one for a smaller id.
//!
//! Memory: `MAX_STREAMS`^2 + `MAX_STREAMS` + 2 x `MAX_EVENTS` words.

use crate::abi::{MAX_EVENTS, MAX_STREAMS};

use super::{TaskId, NONE};

/// A stream: 1 ..= [`MAX_STREAMS`]; 0 means no stream.
pub type StreamId = u32;

/// An event: 0 .. [`MAX_EVENTS`].
pub type EventId = u32;

#[derive(Clone, Copy, Debug)]
struct Event {
    /// The stream it was recorded on (0: never recorded).
    stream: StreamId,
    /// It stands for the stream's tasks with smaller ids.
    bound: TaskId,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Streams {
    /// Per stream (index `stream - 1`), its last submitted task.
    last: [TaskId; MAX_STREAMS],
    /// `waits[s][src]`: the next task of stream `s + 1` waits for every
    /// live task of stream `src + 1` with a smaller id (0: no wait).
    waits: [[TaskId; MAX_STREAMS]; MAX_STREAMS],
    /// Bit `s`: stream `s + 1` has a wait for its next task.
    pending: u32,
    events: [Event; MAX_EVENTS],
}

/// Whether `stream` names a stream (0, no stream, is not one).
pub(super) fn is_stream(stream: StreamId) -> bool {
    stream >= 1 && stream as usize <= MAX_STREAMS
}

impl Streams {
    pub(super) const fn new() -> Self {
        Streams {
            last: [NONE; MAX_STREAMS],
            waits: [[0; MAX_STREAMS]; MAX_STREAMS],
            pending: 0,
            events: [Event {
                stream: 0,
                bound: 0,
            }; MAX_EVENTS],
        }
    }

    /// The last task submitted on `stream` (a valid stream), if any.
    pub(super) fn last(&self, stream: StreamId) -> TaskId {
        self.last[stream as usize - 1]
    }

    /// `task` was submitted on `stream`: it is the stream's last, and the
    /// stream's pending waits are wired (by the caller) and done.
    pub(super) fn submitted(&mut self, stream: StreamId, task: TaskId) {
        let s = stream as usize - 1;
        self.last[s] = task;
        if self.pending & (1 << s) != 0 {
            self.waits[s] = [0; MAX_STREAMS];
            self.pending &= !(1 << s);
        }
    }

    /// The pending waits of `stream`'s next task: `(source stream, bound)`.
    pub(super) fn waits(&self, stream: StreamId) -> impl Iterator<Item = (StreamId, TaskId)> + '_ {
        let s = stream as usize - 1;
        let any = self.pending & (1 << s) != 0;
        self.waits[s]
            .iter()
            .enumerate()
            .filter(move |&(_, &bound)| any && bound > 0)
            .map(|(src, &bound)| (src as StreamId + 1, bound))
    }

    /// Records `event` (valid) on `stream` (valid) before task `next`.
    pub(super) fn record(&mut self, stream: StreamId, event: EventId, next: TaskId) {
        self.events[event as usize] = Event {
            stream,
            bound: next,
        };
    }

    /// Makes the next task of `stream` wait for `event`; false if the event
    /// was never recorded.
    pub(super) fn wait(&mut self, stream: StreamId, event: EventId) -> bool {
        let Event { stream: src, bound } = self.events[event as usize];
        if src == 0 {
            return false;
        }
        let s = stream as usize - 1;
        let w = &mut self.waits[s][src as usize - 1];
        *w = (*w).max(bound);
        self.pending |= 1 << s;
        true
    }

    /// Forgets every stream's last task, wait and event (between runs).
    pub(super) fn clear(&mut self) {
        *self = Streams::new();
    }
}
