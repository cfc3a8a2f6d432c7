//! From text to a [`WorkloadFile`]: the nesting guard, serde, the tensor
//! and symbol declarations, and the body's resolution.

use device_runtime::abi::program::MAX_SYMBOLS;
use device_runtime::abi::MAX_RANK;
use wsp_ffi::{DTYPE_F32, DTYPE_I32};

use super::raw::{RawChannel, RawFile, RawSymbol, RawTensor};
use super::resolve::{dtype_text, is_ident, Resolver, Step, RESERVED};
use super::{ErrorKind, FileError, Src, WorkloadFile};
use crate::rng::SplitMix64;

pub(super) struct TensorDef {
    pub(super) name: String,
    pub(super) dtype: u32,
    pub(super) shape: Vec<u32>,
    pub(super) input: bool,
    /// A scratch tensor: no arena bytes, no initial data.
    pub(super) scratch: bool,
    at: usize,
    pub(super) data: Data,
}

/// A tensor's initial data.
pub(super) enum Data {
    Zeros,
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// A declared channel.
pub(super) struct ChannelDef {
    pub(super) name: String,
    pub(super) depth: u32,
    pub(super) latency: u32,
}

pub(super) struct SymbolDef {
    pub(super) name: String,
    pub(super) max: u32,
    pub(super) default: Option<i64>,
}

/// Elements one tensor may have, and bytes the arena may take.
const MAX_ELEMENTS: u64 = 1 << 26;
const MAX_ARENA: u64 = 1 << 28;

/// Brackets and braces nested at most (deeper files are refused before
/// parsing; the device keeps 8 loops).
const MAX_NESTING: usize = 64;

impl WorkloadFile {
    pub(super) fn parse_named(text: &str, default_name: &str) -> Result<WorkloadFile, FileError> {
        nesting(text)?;
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let src = Src { text };
            let mut err = src.at(
                ErrorKind::Syntax,
                e.span().map(|s| s.start),
                e.message().to_string(),
            );
            if err.line.is_none() {
                err.message = e.to_string();
            }
            err
        })?;
        let src = Src { text };
        let mut tensors: Vec<(usize, String, RawTensor)> = raw
            .tensors
            .into_iter()
            .map(|(name, t)| (t.span().start, name, t.into_inner()))
            .collect();
        // Declaration order is the file's (and so the arena's).
        tensors.sort_by_key(|t| t.0);
        let mut defs = Vec::new();
        let mut arena = 0u64;
        for (at, name, t) in &tensors {
            let def = tensor_def(&src, *at, name, t)?;
            arena = arena.next_multiple_of(64)
                + def.shape.iter().map(|&d| d as u64).product::<u64>() * 4;
            if arena > MAX_ARENA {
                return Err(src.at(
                    ErrorKind::Tensor,
                    Some(*at),
                    format!("tensor `{name}`: the tensors take more than {MAX_ARENA} bytes"),
                ));
            }
            defs.push(def);
        }
        let mut symbols: Vec<(usize, String, RawSymbol)> = raw
            .symbols
            .into_iter()
            .map(|(name, s)| (s.span().start, name, s.into_inner()))
            .collect();
        symbols.sort_by_key(|s| s.0);
        if symbols.len() > MAX_SYMBOLS {
            return Err(src.at(
                ErrorKind::Symbol,
                Some(symbols[MAX_SYMBOLS].0),
                format!("more than {MAX_SYMBOLS} symbols"),
            ));
        }
        let mut symbol_defs = Vec::new();
        for (at, name, s) in &symbols {
            if !is_ident(name) || RESERVED.contains(&name.as_str()) {
                return Err(src.at(
                    ErrorKind::Symbol,
                    Some(*at),
                    format!("`{name}` cannot name a symbol: use letters, digits and _, not min, max, load or x"),
                ));
            }
            if let Some(d) = s.default {
                if d < 0 || d > s.max as i64 {
                    return Err(src.at(
                        ErrorKind::Symbol,
                        Some(*at),
                        format!("symbol `{name}`: default {d} outside [0, {}]", s.max),
                    ));
                }
            }
            symbol_defs.push(SymbolDef {
                name: name.clone(),
                max: s.max,
                default: s.default,
            });
        }
        let channels = channel_defs(&src, raw.channels, &symbol_defs)?;
        let mut r = Resolver {
            src,
            written: vec![false; defs.len()],
            tensors: defs,
            symbols: symbol_defs,
            scope: Vec::new(),
            loads: Vec::new(),
            expr_base: 0,
            tasksets: Vec::new(),
            channels: channels.iter().map(|(_, c)| c.name.clone()).collect(),
            nesting: 0,
            in_process: false,
            last_call: vec![None],
        };
        let steps = r.body(&raw.body, 0)?;
        // A channel nobody sends on would leave its consumers waiting.
        let mut sent = vec![false; channels.len()];
        mark_sent(&steps, &mut sent);
        if let Some(c) = sent.iter().position(|s| !s) {
            let (at, def) = &channels[c];
            return Err(r.err(
                ErrorKind::Channel,
                *at,
                format!(
                    "channel `{}`: nothing sends on it, so its consumers would wait forever \
                     (send on it, or remove it)",
                    def.name
                ),
            ));
        }
        // A load of data nobody writes must be of an input.
        for &(t, at) in &r.loads {
            let def = &r.tensors[t.0 as usize];
            if !def.input && !r.written[t.0 as usize] {
                return Err(r.err(
                    ErrorKind::Tensor,
                    at,
                    format!(
                        "the program reads `{}`, which no call writes: if the host provides it, \
                         mark it `input = true` (line {})",
                        def.name,
                        r.src
                            .at(ErrorKind::Tensor, Some(def.at), String::new())
                            .line
                            .unwrap_or(0)
                    ),
                ));
            }
        }
        let name = raw.name.unwrap_or_else(|| default_name.to_string());
        let summary = raw.summary.unwrap_or_default();
        let mut window = None;
        if let Some(w) = raw
            .schedule
            .as_ref()
            .and_then(|s| s.get_ref().window.as_ref())
        {
            let max = device_runtime::abi::TASK_WINDOW;
            if *w.get_ref() == 0 || *w.get_ref() as usize > max {
                return Err(r.err(
                    ErrorKind::Structure,
                    w.span().start,
                    format!("task window {}; 1 to {max} tasks", w.get_ref()),
                ));
            }
            window = Some(*w.get_ref());
        }
        let heap = match raw
            .schedule
            .as_ref()
            .and_then(|s| s.get_ref().heap.as_ref())
        {
            Some(h) => {
                let bytes = *h.get_ref();
                if bytes == 0 || !bytes.is_multiple_of(64) || bytes > u32::MAX as u64 {
                    return Err(r.err(
                        ErrorKind::Structure,
                        h.span().start,
                        format!("heap of {bytes} bytes; a positive multiple of 64 below 4 GiB"),
                    ));
                }
                // The ring would only take arena bytes.
                if !r.tensors.iter().any(|t| t.scratch) {
                    return Err(r.err(
                        ErrorKind::Structure,
                        h.span().start,
                        format!(
                            "heap of {bytes} bytes, but no scratch tensor uses the heap: declare \
                             one (scratch = true) or leave out heap"
                        ),
                    ));
                }
                Some(bytes)
            }
            None => {
                // Without a ring a scratch tensor has no storage at all.
                if let Some(t) = r.tensors.iter().find(|t| t.scratch) {
                    let bytes = t.shape.iter().map(|&d| d as u64).product::<u64>() * 4;
                    return Err(r.err(
                        ErrorKind::Tensor,
                        t.at,
                        format!(
                            "tensor `{}` is a scratch tensor ({bytes} bytes), whose storage comes \
                             from the heap ring, but the file gives no heap: add `heap = BYTES` \
                             (a multiple of 64) under [schedule], or drop `scratch = true`",
                            t.name
                        ),
                    ));
                }
                None
            }
        };
        let Resolver {
            tensors, symbols, ..
        } = r;
        Ok(WorkloadFile {
            name,
            summary,
            text: text.to_string(),
            tensors,
            symbols,
            steps,
            window,
            heap,
            channels: channels.into_iter().map(|(_, c)| c).collect(),
        })
    }
}

/// The `[channels]` declarations, in file order, with their offsets.
fn channel_defs(
    src: &Src<'_>,
    raw: std::collections::BTreeMap<String, toml::Spanned<RawChannel>>,
    symbols: &[SymbolDef],
) -> Result<Vec<(usize, ChannelDef)>, FileError> {
    use device_runtime::abi::program::{MAX_CHANNELS, MAX_CHANNEL_CAPACITY, MAX_CHANNEL_LATENCY};
    let mut list: Vec<(usize, String, RawChannel)> = raw
        .into_iter()
        .map(|(name, c)| (c.span().start, name, c.into_inner()))
        .collect();
    list.sort_by_key(|c| c.0);
    let mut defs = Vec::new();
    for (i, (at, name, c)) in list.into_iter().enumerate() {
        let bad = |at: usize, message: String| src.at(ErrorKind::Channel, Some(at), message);
        if i == MAX_CHANNELS {
            return Err(bad(at, format!("more than {MAX_CHANNELS} channels")));
        }
        if !is_ident(&name) || RESERVED.contains(&name.as_str()) {
            return Err(bad(
                at,
                format!("`{name}` cannot name a channel: use letters, digits and _, not min, max, load or x"),
            ));
        }
        if symbols.iter().any(|s| s.name == name) {
            return Err(bad(at, format!("channel `{name}`: already a symbol")));
        }
        let depth = c.depth.as_ref().map_or(1, |d| *d.get_ref());
        if depth as usize > MAX_CHANNEL_CAPACITY {
            let at = c.depth.as_ref().map_or(at, |d| d.span().start);
            return Err(bad(
                at,
                format!("channel `{name}`: depth {depth}; a channel holds 0 to {MAX_CHANNEL_CAPACITY} tokens"),
            ));
        }
        let latency = c.latency.as_ref().map_or(0, |l| *l.get_ref());
        if latency > MAX_CHANNEL_LATENCY {
            let at = c.latency.as_ref().map_or(at, |l| l.span().start);
            return Err(bad(
                at,
                format!("channel `{name}`: latency {latency}; at most {MAX_CHANNEL_LATENCY} ticks"),
            ));
        }
        defs.push((
            at,
            ChannelDef {
                name,
                depth,
                latency,
            },
        ));
    }
    Ok(defs)
}

/// Sets `sent[c]` for each channel some send of `steps` sends on.
fn mark_sent(steps: &[Step], sent: &mut [bool]) {
    for step in steps {
        match step {
            Step::Send { channel, .. } => sent[*channel as usize] = true,
            Step::Loop { body, .. }
            | Step::Select { body, .. }
            | Step::Stream { body, .. }
            | Step::Dispatch { body, .. }
            | Step::Process { body, .. }
            | Step::Consume { body, .. } => mark_sent(body, sent),
            Step::When {
                then, otherwise, ..
            } => {
                mark_sent(then, sent);
                mark_sent(otherwise, sent);
            }
            Step::Let { .. }
            | Step::Call { .. }
            | Step::Event { .. }
            | Step::Close { .. }
            | Step::Free { .. } => {}
        }
    }
}

/// The steps nested in `step`: a body (of a loop, select, stream,
/// dispatch, process or consume loop) or a branch's two arms.
fn nested(step: &Step) -> [&[Step]; 2] {
    match step {
        Step::Loop { body, .. }
        | Step::Select { body, .. }
        | Step::Stream { body, .. }
        | Step::Dispatch { body, .. }
        | Step::Process { body, .. }
        | Step::Consume { body, .. } => [body, &[]],
        Step::When {
            then, otherwise, ..
        } => [then, otherwise],
        Step::Let { .. }
        | Step::Call { .. }
        | Step::Send { .. }
        | Step::Event { .. }
        | Step::Close { .. }
        | Step::Free { .. } => [&[], &[]],
    }
}

/// Whether a step of `steps`, or one nested in any of them, is one `hit`
/// picks.
fn any_step(steps: &[Step], hit: &impl Fn(&Step) -> bool) -> bool {
    (steps.iter()).any(|s| hit(s) || nested(s).iter().any(|inner| any_step(inner, hit)))
}

/// Whether `steps` call a kernel anywhere (in a loop, branch or process
/// too).
pub(super) fn has_call(steps: &[Step]) -> bool {
    any_step(steps, &|s| matches!(s, Step::Call { .. }))
}

/// Whether `steps` send on or consume from a channel anywhere.
pub(super) fn uses_channel(steps: &[Step]) -> bool {
    any_step(steps, &|s| {
        matches!(s, Step::Send { .. } | Step::Consume { .. })
    })
}

/// The processes whose entries come after a top-level entry of the
/// program that sends on or consumes from a channel: they start only once
/// the program has done that entry.
pub(super) fn late_processes(steps: &[Step]) -> Vec<&str> {
    let Some(first) = steps
        .iter()
        .position(|s| !matches!(s, Step::Process { .. }) && uses_channel(std::slice::from_ref(s)))
    else {
        return Vec::new();
    };
    steps[first..]
        .iter()
        .filter_map(|s| match s {
            Step::Process { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

/// Refuses text whose arrays and tables nest deeper than [`MAX_NESTING`]
/// (outside strings and comments), before a parser recurses into it.
fn nesting(text: &str) -> Result<(), FileError> {
    let (mut depth, mut quote, mut comment, mut escaped) = (0usize, None::<char>, false, false);
    for (at, c) in text.char_indices() {
        if comment {
            comment = c != '\n';
        } else if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q == '"' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
        } else {
            match c {
                '#' => comment = true,
                '"' | '\'' => quote = Some(c),
                '[' | '{' => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(Src { text }.at(
                            ErrorKind::Syntax,
                            Some(at),
                            format!("arrays and tables nested deeper than {MAX_NESTING}"),
                        ));
                    }
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    Ok(())
}

/// A tensor's declaration and initial data, checked.
fn tensor_def(src: &Src, at: usize, name: &str, t: &RawTensor) -> Result<TensorDef, FileError> {
    let bad = |m: String| src.at(ErrorKind::Tensor, Some(at), format!("tensor `{name}`: {m}"));
    if !is_ident(name) || name.len() > 16 {
        return Err(bad(
            "a tensor name is up to 16 letters, digits and _, not starting with a digit".into(),
        ));
    }
    let dtype = match t.dtype.as_deref() {
        None | Some("f32") => DTYPE_F32,
        Some("i32") => DTYPE_I32,
        Some(other) => return Err(bad(format!("dtype \"{other}\"; dtypes are f32 and i32"))),
    };
    if t.shape.is_empty() || t.shape.len() > MAX_RANK || t.shape.contains(&0) {
        return Err(bad(format!(
            "shape {:?}: 1 to {MAX_RANK} dimensions, none 0",
            t.shape
        )));
    }
    let elements = t
        .shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| {
            bad(format!(
                "shape {:?}: more than {MAX_ELEMENTS} elements",
                t.shape
            ))
        })? as usize;
    if t.scratch == Some(true)
        && (t.init.is_some() || t.values.is_some() || t.input == Some(true) || dtype != DTYPE_F32)
    {
        return Err(bad(
            "a scratch tensor is an f32 intermediate with no initial data: \
             leave out init, values and input"
                .into(),
        ));
    }
    let init = match (t.init.as_deref(), &t.values) {
        (None, Some(_)) | (Some("values"), Some(_)) => "values",
        (Some("values"), None) => return Err(bad("init = \"values\" needs `values`".into())),
        (None, None) => "zeros",
        (Some(i @ ("zeros" | "random")), None) => i,
        (Some(_), Some(_)) => {
            return Err(bad(
                "`values` gives the data: leave out init (or write init = \"values\")".into(),
            ))
        }
        (Some(other), None) => {
            return Err(bad(format!(
                "init \"{other}\"; inits are \"zeros\", \"random\" (with a seed) and \"values\""
            )))
        }
    };
    let present = [
        ("seed", t.seed.is_some()),
        ("skip", t.skip.is_some()),
        ("scale", t.scale.is_some()),
        ("range", t.range.is_some()),
    ];
    let allowed: &[&str] = match (init, dtype) {
        ("random", DTYPE_F32) => &["seed", "skip", "scale"],
        ("random", _) => &["seed", "skip", "range"],
        _ => &[],
    };
    if let Some((key, _)) = present.iter().find(|(k, p)| *p && !allowed.contains(k)) {
        return Err(bad(format!(
            "`{key}` does not go with init = \"{init}\" for {}",
            dtype_text(dtype)
        )));
    }
    let data = match init {
        "zeros" => Data::Zeros,
        "values" => {
            let values = t.values.as_deref().unwrap_or(&[]);
            if values.len() != elements {
                return Err(bad(format!(
                    "{} values for {elements} elements (shape {:?})",
                    values.len(),
                    t.shape
                )));
            }
            if dtype == DTYPE_I32 {
                let mut out = Vec::with_capacity(elements);
                for &v in values {
                    if v.fract() != 0.0 || v < i32::MIN as f64 || v > i32::MAX as f64 {
                        return Err(bad(format!("{v} is not an i32")));
                    }
                    out.push(v as i32);
                }
                Data::I32(out)
            } else {
                if let Some(v) = values.iter().find(|&&v| !(v as f32).is_finite()) {
                    return Err(bad(format!("{v} is not a finite f32")));
                }
                Data::F32(values.iter().map(|&v| v as f32).collect())
            }
        }
        _ => {
            let seed = t
                .seed
                .ok_or_else(|| bad("init = \"random\" needs a seed".into()))?;
            let skip = t.skip.unwrap_or(0);
            if skip > 1 << 32 {
                return Err(bad(format!("skip {skip} is more than 2^32")));
            }
            let mut rng = SplitMix64::new(seed);
            rng.skip(skip);
            if dtype == DTYPE_F32 {
                let scale = t.scale.unwrap_or(1.0);
                if !(scale as f32).is_finite() {
                    return Err(bad(format!("scale {scale} is not a finite f32")));
                }
                let scale = scale as f32;
                Data::F32(rng.fill(elements).iter().map(|v| v * scale).collect())
            } else {
                let [lo, hi] = t
                    .range
                    .ok_or_else(|| bad("random i32 data needs range = [lo, hi]".into()))?;
                if lo > hi || lo < i32::MIN as i64 || hi > i32::MAX as i64 {
                    return Err(bad(format!("range [{lo}, {hi}] is not an i32 range")));
                }
                let span = (hi - lo) as u64 + 1;
                Data::I32(
                    (0..elements)
                        .map(|_| (lo + rng.below(span) as i64) as i32)
                        .collect(),
                )
            }
        }
    };
    Ok(TensorDef {
        name: name.to_string(),
        dtype,
        shape: t.shape.clone(),
        input: t.input.unwrap_or(false),
        scratch: t.scratch.unwrap_or(false),
        at,
        data,
    })
}
