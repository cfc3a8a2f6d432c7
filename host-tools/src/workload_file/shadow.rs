//! The f64 reference: the expansion, executed task by task on a shadow
//! of the arena.

use std::cell::Cell;

use device_runtime::abi::program::MAX_CHANNEL_LATENCY;
use device_runtime::abi::{Region, Table, TensorDesc, MAX_RANK};
use device_runtime::expand::{Context, Expander, Step as ExpandStep};
use wsp_ffi::{KernelInfo, TileShape, DTYPE_I32};

use super::call::describe_shapes;
use super::expr::{arith, RExpr};
use super::kernels::{run_kernel, Tile};
use super::resolve::{RAxis, RRegion, Step};
use super::{ErrorKind, FileError, Src};
use crate::program::{CspNames, Expanded};
use crate::table::{Arena, TensorId, TensorLayout};
// The bounds of every host walk that lists tasks one by one.
use crate::task_count::{MAX_HOST_ITERATIONS as MAX_ITERATIONS, MAX_HOST_TASKS as MAX_TASKS};

/// A region's 2-D view: `rows` x `cols` elements from `first`, rows
/// `stride` apart.
struct View {
    tensor: usize,
    first: usize,
    rows: usize,
    cols: usize,
    stride: usize,
}

pub(super) struct Shadow<'a> {
    src: &'a Src<'a>,
    layouts: &'a [TensorLayout],
    symbols: &'a [i64],
    pub(super) val: Vec<Vec<f64>>,
    pub(super) err: Vec<Vec<f64>>,
    /// Per slot in scope: its value, whether it is a select's value (read
    /// from `indices` at the slot's value), and its name.
    env: Vec<(i64, Option<TensorId>, String)>,
    pub(super) tasks: Vec<Expanded>,
    pub(super) written: Vec<bool>,
    /// Per scratch tensor (`None` for the others): which elements a task
    /// has written since its scope began. A read of any other element
    /// would read whatever the heap holds, so the reference refuses it.
    scope: Vec<Option<Vec<bool>>>,
    pub(super) notes: Vec<String>,
    iterations: u64,
    /// The taskset of the calls being expanded.
    taskset: u8,
}

impl<'a> Shadow<'a> {
    pub(super) fn new(
        src: &'a Src<'a>,
        layouts: &'a [TensorLayout],
        arena: &Arena,
        symbols: &'a [i64],
    ) -> Self {
        let val = layouts
            .iter()
            .map(|l| {
                if l.is_scratch() {
                    // No data before its first writer (see `scope`).
                    vec![0.0; l.elements()]
                } else if l.dtype == DTYPE_I32 {
                    arena.read_i32(l).iter().map(|&v| v as f64).collect()
                } else {
                    arena.read_f32(l).iter().map(|&v| v as f64).collect()
                }
            })
            .collect();
        let err = layouts.iter().map(|l| vec![0.0; l.elements()]).collect();
        let scope = layouts
            .iter()
            .map(|l| l.is_scratch().then(|| vec![false; l.elements()]))
            .collect();
        Shadow {
            src,
            layouts,
            symbols,
            val,
            err,
            env: Vec::new(),
            tasks: Vec::new(),
            written: vec![false; layouts.len()],
            scope,
            notes: Vec::new(),
            iterations: 0,
            taskset: 0,
        }
    }

    /// An expansion error at `at`, with the loop indices in scope.
    fn fail(&self, at: usize, message: String) -> FileError {
        let scope: Vec<String> = self
            .env
            .iter()
            .filter(|(_, lazy, name)| lazy.is_none() && !name.is_empty())
            .map(|(v, _, name)| format!("{name} = {v}"))
            .collect();
        let with = if scope.is_empty() {
            String::new()
        } else {
            format!(" (with {})", scope.join(", "))
        };
        self.src
            .at(ErrorKind::Expand, Some(at), format!("{message}{with}"))
    }

    fn load(&self, t: TensorId, index: &[i64]) -> Result<i64, String> {
        let l = &self.layouts[t.0 as usize];
        let mut flat = 0usize;
        for (d, &i) in index.iter().enumerate() {
            if i < 0 || i >= l.shape[d] as i64 {
                return Err(format!(
                    "load({}, {}): index {i} outside dimension {d} of shape {:?}",
                    l.name,
                    index
                        .iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    l.shape
                ));
            }
            flat = flat * l.shape[d] as usize + i as usize;
        }
        Ok(self.val[t.0 as usize][flat] as i64)
    }

    fn eval(&self, e: &RExpr) -> Result<i64, String> {
        match e {
            RExpr::Const(v) => Ok(*v),
            RExpr::Slot(s) => match &self.env[*s] {
                (v, None, _) => Ok(*v),
                (j, Some(indices), _) => self.load(*indices, &[0, *j]),
            },
            RExpr::Symbol(s) => Ok(self.symbols[*s as usize]),
            RExpr::Load(t, index) => {
                let index = index
                    .iter()
                    .map(|i| self.eval(i))
                    .collect::<Result<Vec<_>, _>>()?;
                self.load(*t, &index)
            }
            RExpr::Bin(op, a, b) => {
                arith(*op, self.eval(a)?, self.eval(b)?).map_err(|m| m.to_string())
            }
        }
    }

    fn count(&mut self, n: i64, max: u32, at: usize) -> Result<i64, FileError> {
        if n < 0 || n > max as i64 {
            return Err(self.fail(at, format!("loop count {n} outside [0, {max}]")));
        }
        self.iterations += n as u64;
        if self.iterations > MAX_ITERATIONS {
            return Err(self.fail(
                at,
                format!("the loops run more than {MAX_ITERATIONS} iterations"),
            ));
        }
        Ok(n)
    }

    pub(super) fn steps(&mut self, steps: &[Step]) -> Result<(), FileError> {
        let depth = self.env.len();
        for step in steps {
            match step {
                Step::Loop {
                    var,
                    axis,
                    body,
                    at,
                    ..
                } => {
                    let (n, max) = match axis {
                        RAxis::Dense(n) => (*n as i64, *n),
                        RAxis::DenseDyn { symbol, max } => (self.symbols[*symbol as usize], *max),
                        RAxis::Ragged {
                            lengths,
                            at: index,
                            max,
                        } => {
                            let index = index
                                .iter()
                                .map(|i| self.eval(i))
                                .collect::<Result<Vec<_>, _>>()
                                .and_then(|i| self.load(*lengths, &i))
                                .map_err(|m| self.fail(*at, m))?;
                            (index, *max)
                        }
                    };
                    for i in 0..self.count(n, max, *at)? {
                        self.env.push((i, None, var.clone()));
                        self.steps(body)?;
                        self.env.pop();
                    }
                }
                Step::Select {
                    indptr,
                    indices,
                    row,
                    max,
                    slot,
                    value,
                    body,
                    at,
                } => {
                    let (start, end) = self
                        .eval(row)
                        .and_then(|r| {
                            let next = r.checked_add(1).ok_or("arithmetic overflow")?;
                            Ok((
                                self.load(*indptr, &[0, r])?,
                                self.load(*indptr, &[0, next])?,
                            ))
                        })
                        .map_err(|m| self.fail(*at, m))?;
                    for v in 0..self.count(end - start, *max, *at)? {
                        let j = start + v;
                        self.env.push((j, None, slot.clone()));
                        self.env.push((j, Some(*indices), value.clone()));
                        self.steps(body)?;
                        self.env.truncate(self.env.len() - 2);
                    }
                }
                Step::When {
                    cond,
                    then,
                    otherwise,
                    at,
                } => {
                    let c = self.eval(cond).map_err(|m| self.fail(*at, m))?;
                    self.steps(if c != 0 { then } else { otherwise })?;
                }
                Step::Let { name, value, at } => {
                    let v = self.eval(value).map_err(|m| self.fail(*at, m))?;
                    self.env.push((v, None, name.clone()));
                }
                Step::Call {
                    kernel,
                    stream,
                    args,
                    scalars,
                    at,
                } => self.call(kernel, *stream, args, scalars, *at)?,
                Step::Stream { body, .. } => {
                    let depth = self.env.len();
                    self.steps(body)?;
                    self.env.truncate(depth);
                }
                Step::Dispatch { set, body, .. } => {
                    let (depth, outer) = (self.env.len(), self.taskset);
                    self.taskset = *set;
                    self.steps(body)?;
                    self.taskset = outer;
                    self.env.truncate(depth);
                }
                // A freed scratch tensor's values are dead: its next
                // scope starts with nothing written.
                Step::Free { tensor } => self.free(tensor.0),
                Step::Event { .. } => {}
                // Files with processes take `Shadow::table` (see there).
                Step::Process { .. }
                | Step::Send { .. }
                | Step::Consume { .. }
                | Step::Close { .. } => {
                    return Err(self.src.at(
                        ErrorKind::Expand,
                        None,
                        "processes and channels are followed by the table walk, not the steps"
                            .to_string(),
                    ))
                }
            }
        }
        self.env.truncate(depth);
        Ok(())
    }

    /// The reference of a program with processes and channels. Which task
    /// a consume loop issues, and in which order, follows the tokens, so
    /// the order comes from the device's own expander run on the host over
    /// `table` (every task complete as soon as it is issued, the clock
    /// moving past every channel latency): one order the device's
    /// dependencies allow, in which each task runs here in f64 on the
    /// shadow as it is issued. The values stay the f64 kernels'; a run
    /// whose tasks overtook one another where the program does not order
    /// them (a race) fails the check.
    pub(super) fn table(&mut self, table: &Table<'_>, names: &CspNames) -> Result<(), FileError> {
        let fail = |m: String| self.src.at(ErrorKind::Expand, None, m);
        let mut expander = Expander::new(table);
        let clock = Cell::new(0u64);
        // Consecutive steps that issued nothing (a bound: a program that
        // can never go on again is reported, not spun on).
        let mut idle = 0u32;
        loop {
            let pc = expander.pc();
            let mut cx = ShadowCx {
                shadow: self,
                next: self.tasks.len() as u64,
                clock: &clock,
            };
            let step = expander.step(table, &mut cx);
            clock.set(clock.get() + MAX_CHANNEL_LATENCY as u64 + 1);
            // The frees of this step come before the task it returns.
            while let Some(t) = expander.take_free() {
                self.free(t);
            }
            match step {
                Ok(ExpandStep::Task(spec)) => {
                    idle = 0;
                    let args: Vec<(u32, [u32; MAX_RANK], [u32; MAX_RANK])> = spec
                        .args
                        .iter()
                        .map(|a| (a.tensor, a.region.offset, a.region.extent))
                        .collect();
                    let kernel = wsp_ffi::lookup(spec.kernel.id)
                        .ok_or_else(|| fail(format!("unknown kernel {}", spec.kernel.id)))?;
                    self.run_task(
                        kernel,
                        spec.stream as u8,
                        &args,
                        spec.scalars.to_vec(),
                        spec.taskset,
                    )
                    .map_err(|m| fail(format!("instruction {pc}: {m}")))?;
                }
                Ok(ExpandStep::Done) => return Ok(()),
                Ok(ExpandStep::Event { .. } | ExpandStep::Yield) => {}
                Ok(ExpandStep::Wait(_)) => {
                    idle += 1;
                    if idle > 1 << 16 {
                        // Every task is complete and the clock past every
                        // latency: the processes wait on each other.
                        let report = expander.channel_report(table);
                        let legend = names
                            .legend(&report)
                            .map_or(String::new(), |l| format!("\n{l}"));
                        return Err(fail(format!(
                            "the reference cannot finish, and neither can a run: {report}{legend}"
                        )));
                    }
                }
                Err(e) => return Err(fail(format!("instruction {pc}: {e}"))),
            }
        }
    }

    fn call(
        &mut self,
        kernel: &KernelInfo,
        stream: u8,
        args: &[RRegion],
        scalars: &[RExpr],
        at: usize,
    ) -> Result<(), FileError> {
        let mut expanded = Vec::new();
        for (k, r) in args.iter().enumerate() {
            let l = &self.layouts[r.tensor.0 as usize];
            let rank = l.shape.len();
            let what = arg_what(kernel, k);
            let mut offset = [0u32; MAX_RANK];
            let mut extent = [1u32; MAX_RANK];
            let mut ext = vec![1i64; rank];
            ext[rank - 1] = self.eval(&r.cols).map_err(|m| self.fail(at, m))?;
            if rank >= 2 {
                ext[rank - 2] = self.eval(&r.rows).map_err(|m| self.fail(at, m))?;
            }
            for d in 0..rank {
                let o = self.eval(&r.offset[d]).map_err(|m| self.fail(at, m))?;
                let dim = l.shape[d] as i64;
                let end = o.checked_add(ext[d]);
                if o < 0 || ext[d] < 1 || end.is_none_or(|end| end > dim) {
                    // An end past i64 is shown as the sum.
                    let end = end.map_or(format!("{o} + {}", ext[d]), |e| e.to_string());
                    return Err(self.fail(
                        at,
                        format!(
                            "{what}: [{o}, {end}) in dimension {d} is outside `{}` (shape {:?})",
                            l.name, l.shape
                        ),
                    ));
                }
                offset[d] = o as u32;
                extent[d] = ext[d] as u32;
            }
            expanded.push((r.tensor.0, offset, extent));
        }
        let scalars = scalars
            .iter()
            .map(|s| self.eval(s).map(|v| v as u64))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|m| self.fail(at, m))?;
        self.run_task(kernel, stream, &expanded, scalars, self.taskset)
            .map_err(|m| self.fail(at, m))
    }

    /// Runs one task on the shadow: `kernel` on the regions `args` (tensor,
    /// offset and extent per dimension) with `scalars`, checked against
    /// the tensors' shapes and the kernel's contract.
    fn run_task(
        &mut self,
        kernel: &KernelInfo,
        stream: u8,
        args: &[(u32, [u32; MAX_RANK], [u32; MAX_RANK])],
        scalars: Vec<u64>,
        taskset: u8,
    ) -> Result<(), String> {
        if self.tasks.len() == MAX_TASKS {
            return Err(format!("more than {MAX_TASKS} tasks"));
        }
        let mut views = Vec::new();
        let mut shapes = Vec::new();
        for (k, (tensor, offset, extent)) in args.iter().enumerate() {
            let Some(l) = self.layouts.get(*tensor as usize) else {
                return Err(format!(
                    "{}: tensor {tensor} does not exist",
                    arg_what(kernel, k)
                ));
            };
            let rank = l.shape.len();
            let mut first = 0usize;
            for d in 0..rank {
                let (o, e) = (offset[d] as u64, extent[d] as u64);
                if e < 1 || o + e > l.shape[d] as u64 {
                    return Err(format!(
                        "{}: [{o}, {}) in dimension {d} is outside `{}` (shape {:?})",
                        arg_what(kernel, k),
                        o + e,
                        l.name,
                        l.shape
                    ));
                }
                let stride: usize = l.shape[d + 1..].iter().map(|&s| s as usize).product();
                first += o as usize * stride;
            }
            let cols = extent[rank - 1] as usize;
            let (rows, stride) = if rank >= 2 {
                (extent[rank - 2] as usize, l.shape[rank - 1] as usize)
            } else {
                (1, cols)
            };
            shapes.push(TileShape {
                rows: rows as u32,
                cols: cols as u32,
                dtype: l.dtype,
            });
            views.push(View {
                tensor: *tensor as usize,
                first,
                rows,
                cols,
                stride,
            });
        }
        if let Err(e) = kernel.check(&shapes, &scalars) {
            return Err(format!(
                "call {} ({}): {e}",
                kernel.name,
                describe_shapes(kernel, &shapes)
            ));
        }
        if let Some(pair) = overlap(kernel, args) {
            let tensor = &self.layouts[args[pair.0].0 as usize].name;
            return Err(overlap_message(kernel, pair, tensor));
        }
        for (k, (view, spec)) in views.iter().zip(kernel.tensor_args).enumerate() {
            if spec.access.reads() {
                self.check_written(kernel, k, view)?;
            }
        }
        let task = self.tasks.len();
        self.tasks.push(Expanded {
            kernel: kernel.id,
            stream,
            args: args.to_vec(),
            scalars: scalars.clone(),
            taskset,
        });
        let inputs: Vec<Tile> = views.iter().map(|v| self.gather(v)).collect();
        let outputs = run_kernel(kernel.name, &inputs, &scalars, &mut |note| {
            self.notes
                .push(format!("task {task} ({}): {note}", kernel.name))
        })?;
        for ((view, spec), tile) in views.iter().zip(kernel.tensor_args).zip(outputs) {
            if let (true, Some(tile)) = (spec.access.writes(), tile) {
                self.scatter(view, &tile);
                self.written[view.tensor] = true;
                if let Some(set) = &mut self.scope[view.tensor] {
                    for r in 0..view.rows {
                        let from = view.first + r * view.stride;
                        set[from..from + view.cols].fill(true);
                    }
                }
            }
        }
        Ok(())
    }

    /// Ends scratch tensor `tensor`'s scope: nothing of it is written.
    fn free(&mut self, tensor: u32) {
        if let Some(Some(set)) = self.scope.get_mut(tensor as usize) {
            set.fill(false);
        }
    }

    /// Refuses argument `k` of a call of `kernel`, which reads `view`, if
    /// it is on a scratch tensor and no task has written one of its
    /// elements since the tensor's scope began.
    fn check_written(&self, kernel: &KernelInfo, k: usize, view: &View) -> Result<(), String> {
        let Some(set) = &self.scope[view.tensor] else {
            return Ok(());
        };
        for r in 0..view.rows {
            let from = view.first + r * view.stride;
            if let Some(c) = set[from..from + view.cols].iter().position(|w| !w) {
                let l = &self.layouts[view.tensor];
                // The element's index per dimension, from its flat index.
                let mut flat = from + c;
                let mut index = vec![0usize; l.shape.len()];
                for (i, &d) in index.iter_mut().zip(&l.shape).rev() {
                    *i = flat % d as usize;
                    flat /= d as usize;
                }
                let index: Vec<String> = index.iter().map(|i| i.to_string()).collect();
                return Err(format!(
                    "{} reads element [{}] of scratch tensor `{}`, \
                     which no task has written since its scope began: a run would read \
                     whatever the heap holds there (write the whole region first)",
                    arg_what(kernel, k),
                    index.join(", "),
                    l.name
                ));
            }
        }
        Ok(())
    }

    fn gather(&self, v: &View) -> Tile {
        let mut t = Tile::new(v.rows, v.cols);
        for r in 0..v.rows {
            let from = v.first + r * v.stride;
            t.v[r * v.cols..(r + 1) * v.cols]
                .copy_from_slice(&self.val[v.tensor][from..from + v.cols]);
            t.e[r * v.cols..(r + 1) * v.cols]
                .copy_from_slice(&self.err[v.tensor][from..from + v.cols]);
        }
        t
    }

    fn scatter(&mut self, v: &View, t: &Tile) {
        for r in 0..v.rows {
            let to = v.first + r * v.stride;
            self.val[v.tensor][to..to + v.cols].copy_from_slice(&t.v[r * v.cols..(r + 1) * v.cols]);
            self.err[v.tensor][to..to + v.cols].copy_from_slice(&t.e[r * v.cols..(r + 1) * v.cols]);
        }
    }
}

/// Argument `k` of a call of `kernel`, as every message about one names
/// it: `call add argument 0 (a)`, the kernel's parameter in parentheses
/// (what the file's own checks name); the message names the tensor.
pub(super) fn arg_what(kernel: &KernelInfo, k: usize) -> String {
    let param = kernel.tensor_args.get(k).map_or("?", |a| a.name);
    format!("call {} argument {k} ({param})", kernel.name)
}

/// The first pair of a call's arguments on one tensor, one of which it
/// writes, whose regions overlap, as (the writer, the other) by their
/// positions in the call (the later one first when both write): the
/// orchestrator refuses such a task, whose result would depend on the
/// order of the kernel's reads and writes. `args` are the call's regions
/// (tensor, offset and extent per dimension), in the kernel's order.
pub(super) fn overlap(
    kernel: &KernelInfo,
    args: &[(u32, [u32; MAX_RANK], [u32; MAX_RANK])],
) -> Option<(usize, usize)> {
    let writes = |k: usize| kernel.tensor_args.get(k).is_some_and(|a| a.access.writes());
    for (k, &(tensor, offset, extent)) in args.iter().enumerate() {
        for (j, &(other, o2, e2)) in args[..k].iter().enumerate() {
            let a = Region { offset, extent };
            let b = Region {
                offset: o2,
                extent: e2,
            };
            if tensor == other && (writes(k) || writes(j)) && a.overlaps(&b) {
                return Some(if writes(k) { (k, j) } else { (j, k) });
            }
        }
    }
    None
}

/// What is wrong with a call whose argument `writer` overlaps argument
/// `other` on tensor `tensor` (see [`overlap`]).
pub(super) fn overlap_message(
    kernel: &KernelInfo,
    (writer, other): (usize, usize),
    tensor: &str,
) -> String {
    let name = |i: usize| kernel.tensor_args.get(i).map_or("?", |a| a.name);
    format!(
        "call {}: argument {writer} ({}) writes a region of `{tensor}` overlapping argument \
         {other} ({}); a kernel's output may not overlap its other arguments",
        kernel.name,
        name(writer),
        name(other)
    )
}

/// What the device's expander sees when the shadow walks a table: every
/// task complete as soon as it is issued, data from the shadow, a clock
/// the walk moves on.
struct ShadowCx<'s, 'a> {
    shadow: &'s Shadow<'a>,
    next: u64,
    clock: &'s Cell<u64>,
}

impl Context for ShadowCx<'_, '_> {
    fn symbol(&self, index: usize) -> Option<i64> {
        self.shadow.symbols.get(index).copied()
    }
    fn next_task(&self) -> u64 {
        self.next
    }
    fn pending_writer(&mut self, _: u32, _: &Region) -> Option<u64> {
        None
    }
    fn completed_since(&self, _: u64) -> bool {
        true
    }
    fn read_i32(&mut self, tensor: &TensorDesc, element: u64) -> i32 {
        let at = tensor.arena_offset.get();
        self.shadow
            .layouts
            .iter()
            .position(|l| l.arena_offset == at)
            .and_then(|t| self.shadow.val[t].get(element as usize))
            .map_or(0, |&v| v as i32)
    }
    fn now(&self) -> u64 {
        self.clock.get()
    }
}
