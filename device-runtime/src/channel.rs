//! Token channels between the processes of a program (the CSP section of
//! [`crate::abi::program`]): their state in the expander, and what a
//! channel deadlock report says about them.

use core::fmt;

use crate::abi::program::{MAX_CHANNELS, MAX_CHANNEL_CAPACITY};
use crate::expand::MAX_CONTEXTS;

/// Why a context cannot go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Park {
    /// A `SEND` on a full channel (or a rendezvous without a consumer).
    Full {
        /// The channel.
        channel: u8,
    },
    /// A `CONSUME` that can take no token yet.
    Empty {
        /// The channel.
        channel: u8,
        /// The task the oldest token stands for, while it runs.
        task: Option<u64>,
    },
    /// A `CONSUME` whose oldest token's task has completed, waiting for
    /// the channel's latency to pass.
    Latency {
        /// The channel.
        channel: u8,
        /// When the token may be taken (the expansion clock).
        until: u64,
    },
    /// Another wait: data, or the end of a sequential iteration.
    Other,
}

/// A token in a channel.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Token {
    pub(crate) value: i64,
    /// The run's number of the task it stands for (none: ready at once).
    pub(crate) task: Option<u64>,
    /// When it may be consumed: the time its task was seen complete plus
    /// the channel's latency, once known.
    pub(crate) ready_at: Option<u64>,
}

/// A channel's state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chan {
    /// Tokens sent and not taken, oldest first, at `(head + i) % MAX_CHANNEL_CAPACITY`.
    pub(crate) tokens: [Token; MAX_CHANNEL_CAPACITY],
    pub(crate) head: u8,
    pub(crate) queued: u8,
    /// Tokens taken whose consumer's body has not ended.
    pub(crate) in_body: u8,
    /// Room reserved by calls whose `SEND` follows them.
    pub(crate) reserved: u8,
    /// Contexts alive that send on it.
    pub(crate) senders: u8,
    pub(crate) closed: bool,
    pub(crate) capacity: u8,
    pub(crate) latency: u32,
    /// Tokens sent over the run.
    pub(crate) sent: u64,
    /// Most tokens held at once (queued plus in bodies).
    pub(crate) high_water: u8,
}

impl Chan {
    pub(crate) const EMPTY: Chan = Chan {
        tokens: [Token {
            value: 0,
            task: None,
            ready_at: None,
        }; MAX_CHANNEL_CAPACITY],
        head: 0,
        queued: 0,
        in_body: 0,
        reserved: 0,
        senders: 0,
        closed: false,
        capacity: 0,
        latency: 0,
        sent: 0,
        high_water: 0,
    };

    /// Tokens counted against its capacity.
    pub(crate) fn held(&self) -> usize {
        self.queued as usize + self.in_body as usize + self.reserved as usize
    }

    pub(crate) fn front(&mut self) -> Option<&mut Token> {
        (self.queued > 0).then(|| &mut self.tokens[self.head as usize % MAX_CHANNEL_CAPACITY])
    }
}

/// What one channel looks like, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelState {
    /// The channel's number.
    pub channel: u8,
    /// Its capacity (0: rendezvous).
    pub capacity: u8,
    /// Tokens sent and not yet taken.
    pub queued: u8,
    /// Tokens taken whose consumer's body has not ended.
    pub in_body: u8,
    /// Whether it is closed.
    pub closed: bool,
    /// Live processes that send on it.
    pub senders: u8,
    /// Tokens sent over the run.
    pub sent: u64,
    /// The task the oldest queued token stands for, if any.
    pub oldest_task: Option<u64>,
}

/// What one context of the program machine is doing, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessState {
    /// The pc of its `PROCESS`, or `None` for the program's own context.
    pub process: Option<u32>,
    /// Its replica index.
    pub replica: u32,
    /// Its pc.
    pub pc: u32,
    /// Why it is parked, if it is.
    pub park: Option<Park>,
}

impl fmt::Display for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.process {
            None => write!(f, "the program (at pc {})", self.pc),
            Some(start) => write!(
                f,
                "process of pc {start}, replica {} (at pc {})",
                self.replica, self.pc
            ),
        }
    }
}

/// Why every process stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelDeadlockCause {
    /// A process waits for a token on an open channel that no live process
    /// sends on: its senders never started (e.g. zero replicas) and
    /// nothing closes it.
    NoLiveSender {
        /// The channel.
        channel: u8,
    },
    /// The processes wait on each other: each is parked on a channel that
    /// only another parked process would fill or drain.
    Cycle,
}

/// The report of a run whose processes are all parked on channels while
/// no task is in flight: nothing can wake any of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelReport {
    /// Every live context, the program's own first.
    pub processes: [Option<ProcessState>; MAX_CONTEXTS],
    /// Every declared channel.
    pub channels: [Option<ChannelState>; MAX_CHANNELS],
}

impl ChannelReport {
    /// The cause: a channel without a live sender that someone waits on,
    /// else a cycle.
    pub fn cause(&self) -> ChannelDeadlockCause {
        let channel = |c: u8| self.channels.iter().flatten().find(|s| s.channel == c);
        for p in self.processes.iter().flatten() {
            if let Some(Park::Empty { channel: c, .. }) = p.park {
                if channel(c).is_some_and(|s| !s.closed && s.senders == 0 && s.queued == 0) {
                    return ChannelDeadlockCause::NoLiveSender { channel: c };
                }
            }
        }
        ChannelDeadlockCause::Cycle
    }
}

impl fmt::Display for ChannelReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "channel deadlock: every process is parked on a channel and no task is in flight, so none can go on"
        )?;
        for p in self.processes.iter().flatten() {
            write!(f, "  {p}: ")?;
            match p.park {
                Some(Park::Full { channel }) => {
                    writeln!(f, "SEND waits for room on channel {channel}")?
                }
                Some(Park::Empty { channel, task }) => {
                    write!(f, "CONSUME waits for a token on channel {channel}")?;
                    match task {
                        Some(t) => writeln!(f, " (its oldest token's task {t} has not completed)")?,
                        None => writeln!(f)?,
                    }
                }
                Some(Park::Latency { channel, until }) => writeln!(
                    f,
                    "CONSUME waits for channel {channel}'s latency to pass (at {until})"
                )?,
                Some(Park::Other) => writeln!(f, "waits for data or an iteration")?,
                None => writeln!(f, "runnable")?,
            }
        }
        for c in self.channels.iter().flatten() {
            write!(
                f,
                "  channel {}: capacity {}, {} token(s) queued, {} in consumer bodies, {}, {} live sender(s), {} sent",
                c.channel,
                c.capacity,
                c.queued,
                c.in_body,
                if c.closed { "closed" } else { "open" },
                c.senders,
                c.sent
            )?;
            match c.oldest_task {
                Some(t) => writeln!(f, "; the oldest token stands for task {t}")?,
                None => writeln!(f)?,
            }
        }
        match self.cause() {
            ChannelDeadlockCause::NoLiveSender { channel } => write!(
                f,
                "what to change: no live process sends on channel {channel} and nothing closes it; start a process that sends on it (did its PROCESS start zero replicas?) or CLOSE it after the last send"
            ),
            ChannelDeadlockCause::Cycle => write!(
                f,
                "what to change: the processes wait on each other in a cycle; raise the capacity of a channel a sender waits on, or reorder the sends and consumes so that one process can always go on"
            ),
        }
    }
}

/// Bytes of the expander's state per channel (its token ring and
/// counters): the static footprint a channel costs, whether used or not.
pub const BYTES_PER_CHANNEL: usize = core::mem::size_of::<Chan>();
