//! The resolved program: body entries with their names resolved, and the
//! resolver that makes them.

use device_runtime::sched::{DispatchKey, PolicyKind, Schedule};
use toml::Spanned;
use wsp_ffi::{KernelInfo, DTYPE_I32};

use super::expr::RExpr;
use super::parse::{SymbolDef, TensorDef};
use super::raw::RawNode;
use super::{ErrorKind, FileError, Src};
use crate::table::TensorId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Parallel,
    Sequential,
}

pub(super) enum RAxis {
    Dense(u32),
    DenseDyn {
        symbol: u32,
        max: u32,
    },
    Ragged {
        lengths: TensorId,
        at: Vec<RExpr>,
        max: u32,
    },
}

/// A body entry with names resolved; `at` is its byte offset in the file.
pub(super) enum Step {
    Loop {
        kind: Kind,
        var: String,
        axis: RAxis,
        body: Vec<Step>,
        at: usize,
    },
    Select {
        indptr: TensorId,
        indices: TensorId,
        row: RExpr,
        max: u32,
        slot: String,
        value: String,
        body: Vec<Step>,
        at: usize,
    },
    When {
        cond: RExpr,
        then: Vec<Step>,
        otherwise: Vec<Step>,
        at: usize,
    },
    Let {
        name: String,
        value: RExpr,
        at: usize,
    },
    Call {
        kernel: &'static KernelInfo,
        stream: u8,
        args: Vec<RRegion>,
        scalars: Vec<RExpr>,
        at: usize,
    },
    Stream {
        stream: u8,
        body: Vec<Step>,
    },
    /// Calls in `body` belong to taskset `set`, dispatched by `schedule`.
    Dispatch {
        set: u8,
        schedule: Schedule,
        body: Vec<Step>,
    },
    Event {
        record: bool,
        stream: u8,
        event: u8,
    },
    /// A process: one, or one replica per index of `axis` (its index the
    /// next slot in scope).
    Process {
        name: String,
        axis: Option<RAxis>,
        body: Vec<Step>,
    },
    /// A token on `channel`, standing for the last call before it.
    Send {
        channel: u32,
        value: RExpr,
    },
    /// `body` once per token of `channel`, its value the next slot.
    Consume {
        channel: u32,
        body: Vec<Step>,
    },
    Close {
        channel: u32,
    },
    /// Ends scratch tensor `tensor`'s scope.
    Free {
        tensor: TensorId,
    },
}

pub(super) struct RRegion {
    pub(super) tensor: TensorId,
    pub(super) offset: Vec<RExpr>,
    pub(super) rows: RExpr,
    pub(super) cols: RExpr,
}

/// A name in scope: loop variables, `let`s and a select's slot and value
/// each hold one slot.
pub(super) struct ScopeEntry {
    pub(super) name: String,
    what: &'static str,
    /// A select's value: `indices[0, slot before it]`, read where used.
    lazy: Option<TensorId>,
}

/// Resolution state: the file's tensors and symbols, and the names in scope.
pub(super) struct Resolver<'a> {
    pub(super) src: Src<'a>,
    pub(super) tensors: Vec<TensorDef>,
    pub(super) symbols: Vec<SymbolDef>,
    pub(super) scope: Vec<ScopeEntry>,
    /// Tensors some call writes, and the loads (tensor, offset) seen.
    pub(super) written: Vec<bool>,
    pub(super) loads: Vec<(TensorId, usize)>,
    /// The byte offset of the expression string being resolved.
    pub(super) expr_base: usize,
    /// The dispatch schedules of tasksets 1 .., numbered as
    /// `Workload::dispatch` numbers them (in file order).
    pub(super) tasksets: Vec<Schedule>,
    /// The channels' names, by number.
    pub(super) channels: Vec<String>,
    /// Bodies open (1 at the top level).
    pub(super) nesting: usize,
    /// Whether a process body is being resolved.
    pub(super) in_process: bool,
    /// Per open context (the program's, then a process's): its last call
    /// so far, with its label if it has one.
    pub(super) last_call: Vec<Option<Option<String>>>,
}

const KIND_KEYS: [&str; 14] = [
    "process",
    "free",
    "send",
    "consume",
    "close",
    "dispatch",
    "parallel",
    "sequential",
    "select",
    "when",
    "let",
    "call",
    "record",
    "wait",
];

pub(super) fn is_ident(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub(super) const RESERVED: [&str; 4] = ["min", "max", "load", "x"];

pub(super) fn dtype_text(dtype: u32) -> &'static str {
    if dtype == DTYPE_I32 {
        "i32"
    } else {
        "f32"
    }
}

impl Resolver<'_> {
    pub(super) fn err(&self, kind: ErrorKind, at: usize, message: String) -> FileError {
        self.src.at(kind, Some(at), message)
    }

    pub(super) fn tensor(&self, name: &str, at: usize) -> Result<TensorId, FileError> {
        match self.tensors.iter().position(|t| t.name == name) {
            Some(i) => Ok(TensorId(i as u32)),
            None => {
                let known: Vec<&str> = self.tensors.iter().map(|t| t.name.as_str()).collect();
                Err(self.err(
                    ErrorKind::UnknownTensor,
                    at,
                    format!("unknown tensor `{name}` (tensors: {})", known.join(", ")),
                ))
            }
        }
    }

    /// A new name for the scope: an identifier, not a function, not a name
    /// already in scope or a symbol.
    pub(super) fn bind(
        &mut self,
        name: &str,
        what: &'static str,
        at: usize,
    ) -> Result<(), FileError> {
        if !is_ident(name) || RESERVED.contains(&name) {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!("`{name}` cannot name a {what}: use letters, digits and _, not min, max, load or x"),
            ));
        }
        if let Some(e) = self.scope.iter().find(|e| e.name == name) {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!("`{name}` is already a {} here", e.what),
            ));
        }
        if self.symbols.iter().any(|s| s.name == name) {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!("`{name}` is already a symbol"),
            ));
        }
        self.scope.push(ScopeEntry {
            name: name.to_string(),
            what,
            lazy: None,
        });
        Ok(())
    }

    pub(super) fn body(
        &mut self,
        nodes: &[Spanned<RawNode>],
        stream: u8,
    ) -> Result<Vec<Step>, FileError> {
        let depth = self.scope.len();
        self.nesting += 1;
        let mut steps = Vec::new();
        for node in nodes {
            steps.push(self.node(node, stream)?);
        }
        self.nesting -= 1;
        self.scope.truncate(depth);
        Ok(steps)
    }

    fn node(&mut self, node: &Spanned<RawNode>, stream: u8) -> Result<Step, FileError> {
        let at = node.span().start;
        let n = node.get_ref();
        let keys = n.keys();
        let kinds: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| KIND_KEYS.contains(k))
            .collect();
        let kind =
            match kinds.as_slice() {
                [k] => *k,
                [] if keys.contains(&"stream") && keys.contains(&"body") => "stream",
                [] => return Err(self.err(
                    ErrorKind::Structure,
                    at,
                    "a body entry needs one of: parallel, sequential, select, when, let, call, \
                     record, wait, process, send, consume, close, or stream with a body"
                        .to_string(),
                )),
                many => {
                    return Err(self.err(
                        ErrorKind::Structure,
                        at,
                        format!(
                            "a body entry is one thing, this one has {}: split it",
                            many.join(" and ")
                        ),
                    ))
                }
            };
        let allowed: &[&str] = match kind {
            "parallel" | "sequential" => &["dense", "dense_dyn", "ragged", "max", "body"],
            "select" => &["slot", "indptr", "indices", "row", "max", "body"],
            "when" => &["then", "otherwise"],
            "let" => &["value"],
            "call" => &["args", "scalars", "stream", "label"],
            "process" => &["replica", "dense", "dense_dyn", "ragged", "max", "body"],
            "send" => &["value", "after"],
            "consume" => &["as", "body"],
            "close" | "free" => &[],
            "record" | "wait" => &["stream"],
            "dispatch" => &["key", "body"],
            _ => &["body"],
        };
        if let Some(extra) = keys.iter().find(|k| **k != kind && !allowed.contains(k)) {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!(
                    "`{extra}` does not belong in a {kind} entry (it takes: {})",
                    allowed.join(", ")
                ),
            ));
        }
        match kind {
            "parallel" | "sequential" => {
                let name = n
                    .parallel
                    .as_ref()
                    .or(n.sequential.as_ref())
                    .expect("the kind's key");
                let axis = self.axis(n, at, kind)?;
                let body = n.body.as_ref().ok_or_else(|| self.need(at, kind, "body"))?;
                let depth = self.scope.len();
                self.bind(name.get_ref(), "loop variable", name.span().start)?;
                let body = self.body(body, stream)?;
                self.scope.truncate(depth);
                Ok(Step::Loop {
                    var: name.get_ref().clone(),
                    kind: if kind == "parallel" {
                        Kind::Parallel
                    } else {
                        Kind::Sequential
                    },
                    axis,
                    body,
                    at,
                })
            }
            "select" => {
                let value = n.select.as_ref().expect("the kind's key");
                let csr = |r: &Self, t: &Option<Spanned<String>>, what: &str| {
                    let t = t.as_ref().ok_or_else(|| r.need(at, "select", what))?;
                    let id = r.tensor(t.get_ref(), t.span().start)?;
                    let def = &r.tensors[id.0 as usize];
                    if def.dtype != DTYPE_I32 || def.shape.len() != 2 || def.shape[0] != 1 {
                        return Err(r.err(
                            ErrorKind::Shape,
                            t.span().start,
                            format!(
                                "select's {what} `{}` must be an i32 tensor of shape [1, n], not {} {:?}",
                                def.name,
                                dtype_text(def.dtype),
                                def.shape
                            ),
                        ));
                    }
                    Ok((id, t.span().start))
                };
                let (indptr, indptr_at) = csr(self, &n.indptr, "indptr")?;
                let (indices, indices_at) = csr(self, &n.indices, "indices")?;
                self.loads.push((indptr, indptr_at));
                self.loads.push((indices, indices_at));
                let row = n.row.as_ref().ok_or_else(|| self.need(at, kind, "row"))?;
                let row = self.expr(row, "select row")?;
                let max = n.max.as_ref().ok_or_else(|| self.need(at, kind, "max"))?;
                let body = n.body.as_ref().ok_or_else(|| self.need(at, kind, "body"))?;
                let depth = self.scope.len();
                match &n.slot {
                    Some(slot) => self.bind(slot.get_ref(), "select slot", slot.span().start)?,
                    None => self.scope.push(ScopeEntry {
                        name: String::new(),
                        what: "select slot",
                        lazy: None,
                    }),
                }
                self.bind(value.get_ref(), "select value", value.span().start)?;
                self.scope.last_mut().expect("bound above").lazy = Some(indices);
                let body = self.body(body, stream)?;
                self.scope.truncate(depth);
                Ok(Step::Select {
                    indptr,
                    indices,
                    row,
                    max: *max.get_ref(),
                    slot: n
                        .slot
                        .as_ref()
                        .map_or(String::new(), |s| s.get_ref().clone()),
                    value: value.get_ref().clone(),
                    body,
                    at,
                })
            }
            "when" => {
                let cond = self.expr(n.when.as_ref().expect("the kind's key"), "condition")?;
                let then = match &n.then {
                    Some(b) => self.body(b, stream)?,
                    None => return Err(self.need(at, kind, "then")),
                };
                let otherwise = match &n.otherwise {
                    Some(b) => self.body(b, stream)?,
                    None => Vec::new(),
                };
                Ok(Step::When {
                    cond,
                    then,
                    otherwise,
                    at,
                })
            }
            "let" => {
                let name = n.let_.as_ref().expect("the kind's key");
                let value = n
                    .value
                    .as_ref()
                    .ok_or_else(|| self.need(at, kind, "value"))?;
                let value = self.expr(value, &format!("let {}", name.get_ref()))?;
                self.bind(name.get_ref(), "let", name.span().start)?;
                Ok(Step::Let {
                    name: name.get_ref().clone(),
                    value,
                    at,
                })
            }
            "call" => {
                let step = self.call(n, at, stream)?;
                let label = n.label.as_ref().map(|l| l.get_ref().clone());
                *self.last_call.last_mut().expect("the program's context") = Some(label);
                Ok(step)
            }
            "process" => {
                let name = n.process.as_ref().expect("the kind's key");
                if self.nesting != 1 || self.in_process {
                    return Err(self.err(
                        ErrorKind::Channel,
                        at,
                        format!(
                            "process `{}` is inside a loop, branch, dispatch or process: \
                             processes start at the top level",
                            name.get_ref()
                        ),
                    ));
                }
                let axis = if [n.dense.is_some(), n.dense_dyn.is_some(), n.ragged.is_some()]
                    .contains(&true)
                {
                    let axis = self.axis(n, at, kind)?;
                    let most = match &axis {
                        RAxis::Dense(n) => *n,
                        RAxis::DenseDyn { max, .. } | RAxis::Ragged { max, .. } => *max,
                    };
                    let max = device_runtime::abi::program::MAX_PROCESSES;
                    if most == 0 || most as usize > max {
                        return Err(self.err(
                            ErrorKind::Channel,
                            at,
                            format!(
                                "process `{}`: {most} replicas at most; a process has 1 to {max}",
                                name.get_ref()
                            ),
                        ));
                    }
                    Some(axis)
                } else if let Some(r) = &n.replica {
                    return Err(self.err(
                        ErrorKind::Structure,
                        r.span().start,
                        format!(
                            "`replica` names the index of a replicated process: give process `{}` \
                             an axis (dense = N, dense_dyn = \"symbol\" or ragged)",
                            name.get_ref()
                        ),
                    ));
                } else if n.max.is_some() {
                    return Err(self.err(
                        ErrorKind::Structure,
                        at,
                        "`max` of a process goes with dense_dyn".to_string(),
                    ));
                } else {
                    None
                };
                let body = n.body.as_ref().ok_or_else(|| self.need(at, kind, "body"))?;
                let depth = self.scope.len();
                if axis.is_some() {
                    match &n.replica {
                        Some(r) => self.bind(r.get_ref(), "replica index", r.span().start)?,
                        None => self.unnamed("replica index"),
                    }
                }
                self.in_process = true;
                self.last_call.push(None);
                let body = self.body(body, stream);
                self.last_call.pop();
                self.in_process = false;
                let body = body?;
                self.scope.truncate(depth);
                Ok(Step::Process {
                    name: name.get_ref().clone(),
                    axis,
                    body,
                })
            }
            "send" => {
                let channel = self.channel(n.send.as_ref().expect("the kind's key"))?;
                let value = match &n.value {
                    Some(v) => self.expr(v, "send value")?,
                    None => return Err(self.need(at, kind, "value")),
                };
                let last = self.last_call.last().expect("the program's context");
                let problem = match (last, &n.after) {
                    (None, after) => Some((
                        after.as_ref().map_or(at, |a| a.span().start),
                        "the token stands for the last call before the send, and this process \
                         made none"
                            .to_string(),
                    )),
                    (Some(label), Some(after)) if label.as_deref() != Some(after.get_ref()) => {
                        Some((
                            after.span().start,
                            format!(
                                "`after = \"{}\"` is not the last call before this send (that is {}): \
                                 the token stands for the last call the process made",
                                after.get_ref(),
                                label.as_ref().map_or("a call without a label".to_string(), |l| {
                                    format!("`{l}`")
                                })
                            ),
                        ))
                    }
                    _ => None,
                };
                if let Some((where_, why)) = problem {
                    return Err(self.err(
                        ErrorKind::Channel,
                        where_,
                        format!(
                            "send on `{}`: {why}",
                            n.send.as_ref().expect("the kind's key").get_ref()
                        ),
                    ));
                }
                Ok(Step::Send { channel, value })
            }
            "consume" => {
                let channel = self.channel(n.consume.as_ref().expect("the kind's key"))?;
                let body = n.body.as_ref().ok_or_else(|| self.need(at, kind, "body"))?;
                let depth = self.scope.len();
                match &n.as_ {
                    Some(t) => self.bind(t.get_ref(), "token value", t.span().start)?,
                    None => self.unnamed("token value"),
                }
                let body = self.body(body, stream)?;
                self.scope.truncate(depth);
                Ok(Step::Consume { channel, body })
            }
            "close" => {
                let channel = self.channel(n.close.as_ref().expect("the kind's key"))?;
                Ok(Step::Close { channel })
            }
            "free" => {
                let name = n.free.as_ref().expect("the kind's key");
                let tensor = self.tensor(name.get_ref(), name.span().start)?;
                if !self.tensors[tensor.0 as usize].scratch {
                    return Err(self.err(
                        ErrorKind::Tensor,
                        name.span().start,
                        format!(
                            "free = \"{}\": only scratch tensors (scratch = true) are freed",
                            name.get_ref()
                        ),
                    ));
                }
                Ok(Step::Free { tensor })
            }
            "record" | "wait" => {
                let event = n
                    .record
                    .as_ref()
                    .or(n.wait.as_ref())
                    .expect("the kind's key");
                let s = n
                    .stream
                    .as_ref()
                    .ok_or_else(|| self.need(at, kind, "stream"))?;
                let stream = self.stream_number(s)?;
                if *event.get_ref() as usize >= device_runtime::abi::MAX_EVENTS {
                    return Err(self.err(
                        ErrorKind::Structure,
                        event.span().start,
                        format!(
                            "event {}; events are 0 to {}",
                            event.get_ref(),
                            device_runtime::abi::MAX_EVENTS - 1
                        ),
                    ));
                }
                Ok(Step::Event {
                    record: kind == "record",
                    stream,
                    event: *event.get_ref() as u8,
                })
            }
            "dispatch" => {
                let policy = n.dispatch.as_ref().expect("the kind's key");
                let kind = PolicyKind::ALL
                    .into_iter()
                    .find(|k| k.name() == policy.get_ref())
                    .ok_or_else(|| {
                        let names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
                        self.err(
                            ErrorKind::Structure,
                            policy.span().start,
                            format!(
                                "dispatch policy `{}`; policies are {}",
                                policy.get_ref(),
                                names.join(", ")
                            ),
                        )
                    })?;
                if let (Some(k), false) = (&n.key, kind.uses_key()) {
                    let keyed: Vec<&str> = PolicyKind::ALL
                        .iter()
                        .filter(|k| k.uses_key())
                        .map(|k| k.name())
                        .collect();
                    return Err(self.err(
                        ErrorKind::Structure,
                        k.span().start,
                        format!(
                            "dispatch key `{}`: a key applies to the key-based policies ({}); \
                             {} places tasks without one (leave out the key)",
                            k.get_ref(),
                            keyed.join(", "),
                            kind.name()
                        ),
                    ));
                }
                let key = match &n.key {
                    Some(k) => k.get_ref().parse::<DispatchKey>().map_err(|e| {
                        self.err(
                            ErrorKind::Structure,
                            k.span().start,
                            format!("dispatch key `{}`: {e}", k.get_ref()),
                        )
                    })?,
                    None => DispatchKey::TaskIndex,
                };
                let schedule = Schedule { policy: kind, key };
                let set = match self.tasksets.iter().position(|s| *s == schedule) {
                    Some(i) => i + 1,
                    None => {
                        self.tasksets.push(schedule);
                        self.tasksets.len()
                    }
                };
                if set >= device_runtime::abi::program::MAX_TASKSETS {
                    return Err(self.err(
                        ErrorKind::Structure,
                        at,
                        format!(
                            "{set} different dispatch schedules; a workload has at most {}",
                            device_runtime::abi::program::MAX_TASKSETS - 1
                        ),
                    ));
                }
                let body = n
                    .body
                    .as_ref()
                    .ok_or_else(|| self.need(at, "dispatch", "body"))?;
                let depth = self.scope.len();
                let body = self.body(body, stream)?;
                self.scope.truncate(depth);
                Ok(Step::Dispatch {
                    set: set as u8,
                    schedule,
                    body,
                })
            }
            _ => {
                let s = n.stream.as_ref().expect("checked above");
                let stream = self.stream_number(s)?;
                let body = self.body(n.body.as_ref().expect("checked above"), stream)?;
                Ok(Step::Stream { stream, body })
            }
        }
    }

    /// A slot in scope that no name reaches (a process's or a consume's
    /// value the file does not name).
    fn unnamed(&mut self, what: &'static str) {
        self.scope.push(ScopeEntry {
            name: String::new(),
            what,
            lazy: None,
        });
    }

    /// The number of the channel `name` names.
    fn channel(&self, name: &Spanned<String>) -> Result<u32, FileError> {
        match self.channels.iter().position(|c| c == name.get_ref()) {
            Some(c) => Ok(c as u32),
            None => Err(self.err(
                ErrorKind::Channel,
                name.span().start,
                format!(
                    "unknown channel `{}` ({})",
                    name.get_ref(),
                    if self.channels.is_empty() {
                        "no channels; declare them in [channels]".to_string()
                    } else {
                        format!("channels: {}", self.channels.join(", "))
                    }
                ),
            )),
        }
    }

    pub(super) fn need(&self, at: usize, kind: &str, what: &str) -> FileError {
        self.err(
            ErrorKind::Structure,
            at,
            format!("a {kind} entry needs `{what}`"),
        )
    }

    pub(super) fn stream_number(&self, s: &Spanned<u32>) -> Result<u8, FileError> {
        let max = device_runtime::abi::MAX_STREAMS;
        if *s.get_ref() == 0 || *s.get_ref() as usize > max {
            return Err(self.err(
                ErrorKind::Structure,
                s.span().start,
                format!("stream {}; streams are 1 to {max}", s.get_ref()),
            ));
        }
        Ok(*s.get_ref() as u8)
    }

    fn axis(&mut self, n: &RawNode, at: usize, kind: &str) -> Result<RAxis, FileError> {
        let given = [n.dense.is_some(), n.dense_dyn.is_some(), n.ragged.is_some()];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!(
                    "a {kind} loop needs exactly one axis: dense = N, dense_dyn = \"symbol\" \
                     or ragged = {{ lengths = \"t\", at = [..], max = N }}"
                ),
            ));
        }
        if n.max.is_some() && n.dense_dyn.is_none() {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                "`max` of a loop goes with dense_dyn (a ragged axis has its own max)".to_string(),
            ));
        }
        if let Some(d) = &n.dense {
            return Ok(RAxis::Dense(*d.get_ref()));
        }
        if let Some(s) = &n.dense_dyn {
            let Some(symbol) = self.symbols.iter().position(|x| x.name == *s.get_ref()) else {
                let known: Vec<&str> = self.symbols.iter().map(|s| s.name.as_str()).collect();
                return Err(self.err(
                    ErrorKind::Symbol,
                    s.span().start,
                    format!(
                        "unknown symbol `{}` (symbols: {})",
                        s.get_ref(),
                        if known.is_empty() {
                            "none; declare them in [symbols]".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            };
            let def = &self.symbols[symbol];
            // A larger max would let a table take symbol values the file
            // refuses, and the run fail midway.
            if let Some(m) = n.max.as_ref().filter(|m| *m.get_ref() > def.max) {
                return Err(self.err(
                    ErrorKind::Symbol,
                    m.span().start,
                    format!(
                        "`max = {}` of a loop over symbol `{}`, whose max is {}: a loop's max \
                         is at most its symbol's (leave it out to take the symbol's)",
                        m.get_ref(),
                        def.name,
                        def.max
                    ),
                ));
            }
            let max = n.max.as_ref().map_or(def.max, |m| *m.get_ref());
            return Ok(RAxis::DenseDyn {
                symbol: symbol as u32,
                max,
            });
        }
        let r = n.ragged.as_ref().expect("one axis is given").get_ref();
        let lengths = self.tensor(r.lengths.get_ref(), r.lengths.span().start)?;
        let def = &self.tensors[lengths.0 as usize];
        if def.dtype != DTYPE_I32 || r.at.len() != def.shape.len() {
            return Err(self.err(
                ErrorKind::Shape,
                r.lengths.span().start,
                format!(
                    "ragged lengths `{}` must be an i32 tensor indexed by `at` (one index per dimension): it is {} {:?}, at has {}",
                    def.name,
                    dtype_text(def.dtype),
                    def.shape,
                    r.at.len()
                ),
            ));
        }
        self.loads.push((lengths, r.lengths.span().start));
        let at_exprs =
            r.at.iter()
                .map(|e| self.expr(e, "ragged index"))
                .collect::<Result<_, _>>()?;
        Ok(RAxis::Ragged {
            lengths,
            at: at_exprs,
            max: r.max,
        })
    }
}
