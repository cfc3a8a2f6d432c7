//! The executor against an adversarial platform: random DAGs over partially
//! overlapping regions, completed in random order, checked against a
//! dependency oracle built from the arena bytes each argument touches (not
//! from `Region::overlaps`) and against in-order execution.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};

use device_runtime::abi::{dtype_size, Access, Table, TensorArg};
use device_runtime::exec;
use device_runtime::platform::{Clock, Completion, Platform};
use device_runtime::sched::{self, kernel_args};
use device_runtime::sched::{RunError, RunOptions, RunStats};
use host_tools::rng::SplitMix64;
use host_tools::table::{Arena, Arg, TableBuilder};
use wsp_ffi::ArgAccess::{In, InOut, Out};
use wsp_ffi::{CoreKind, WspKernelArgs};

#[path = "../../device-runtime/tests/element_sets/mod.rs"]
mod element_sets;
use element_sets::{elements, share_an_element, Sweep, Touch};

const ADD: u32 = wsp_ffi::WspKernelId_WSP_KERNEL_ADD;
const GEMM: u32 = wsp_ffi::WspKernelId_WSP_KERNEL_GEMM_TILE;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Finish a running task with probability 1/3 per poll.
    Random,
    /// Never finish.
    Never,
    /// Report every task as rejected.
    Reject,
}

/// Cores that run a kernel only when polled, in an order chosen at random.
struct Adversary {
    kinds: Vec<CoreKind>,
    running: Vec<Option<(u32, WspKernelArgs)>>,
    rng: SplitMix64,
    mode: Mode,
    ticks: Cell<u64>,
    /// (launch or finish, key of the args) in the order they happened.
    events: Vec<(bool, [u64; 3])>,
}

impl Adversary {
    fn new(kinds: Vec<CoreKind>, seed: u64, mode: Mode) -> Self {
        let running = vec![None; kinds.len()];
        Adversary {
            kinds,
            running,
            rng: SplitMix64::new(seed),
            mode,
            ticks: Cell::new(0),
            events: Vec::new(),
        }
    }
}

fn key(args: &WspKernelArgs) -> [u64; 3] {
    [
        args.tensors[0].addr,
        args.tensors[1].addr,
        args.tensors[2].addr,
    ]
}

impl Clock for Adversary {
    /// One millisecond per reading, so that timeouts come quickly.
    fn now(&self) -> u64 {
        self.ticks.set(self.ticks.get() + 1);
        self.ticks.get()
    }
    fn ticks_per_second(&self) -> u64 {
        1000
    }
}

impl Platform for Adversary {
    fn num_cores(&self) -> usize {
        self.kinds.len()
    }
    fn core_kind(&self, core: usize) -> CoreKind {
        self.kinds[core]
    }
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        if self.running[core].is_some() {
            return false;
        }
        self.events.push((true, key(args)));
        self.running[core] = Some((kernel_id, *args));
        true
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        let (kernel_id, args) = self.running[core]?;
        match self.mode {
            Mode::Never => return None,
            Mode::Reject => {
                self.running[core] = None;
                return Some(Completion::Rejected);
            }
            Mode::Random if self.rng.below(3) != 0 => return None,
            Mode::Random => {}
        }
        self.running[core] = None;
        self.events.push((false, key(&args)));
        let info = wsp_ffi::lookup(kernel_id).unwrap();
        // SAFETY: `launch`'s contract, upheld by the executor, covers the
        // views until this completion is reported.
        let cycles = unsafe { info.invoke(&args) }.unwrap();
        Some(Completion::Done { cycles })
    }
}

/// A random program of add and GEMM tasks on 16x16 tiles of three 64x64
/// tensors, at offsets that are multiples of 8, so regions overlap partially.
fn random_program(rng: &mut SplitMix64, tasks: usize) -> (Vec<u8>, Arena) {
    let mut b = TableBuilder::new();
    let t = [
        b.tensor("T0", &[64, 64]).unwrap(),
        b.tensor("T1", &[64, 64]).unwrap(),
        b.tensor("T2", &[64, 64]).unwrap(),
    ];
    let tile = |rng: &mut SplitMix64, access| {
        let tensor = t[rng.below(3) as usize];
        Arg::tile(
            tensor,
            access,
            8 * rng.below(7) as u32,
            8 * rng.below(7) as u32,
            16,
            16,
        )
    };
    while b.num_tasks() < tasks {
        let (kernel, args) = if rng.below(2) == 0 {
            (ADD, [tile(rng, In), tile(rng, In), tile(rng, Out)])
        } else {
            (GEMM, [tile(rng, In), tile(rng, In), tile(rng, InOut)])
        };
        // Tasks that write over their own inputs are invalid; draw again.
        // (Every tensor is 64 x 64, row major.)
        let cells = |a: &Arg| elements(&a.offset, &a.extent, &[64, 1, 0, 0]);
        let out = cells(&args[2]);
        let clash = args[..2]
            .iter()
            .any(|a| a.tensor == args[2].tensor && share_an_element(&cells(a), &out));
        if !clash {
            b.task(kernel, &args, &[]).unwrap();
        }
    }
    let mut arena = Arena::zeroed(b.arena_size());
    for &id in &t {
        // Small values keep repeated GEMMs finite.
        let values: Vec<f32> = rng.fill(64 * 64).iter().map(|v| v * 0.25).collect();
        arena.write_f32(b.layout(id), &values);
    }
    (b.finish().unwrap(), arena)
}

/// The args key each task will be launched with: the addresses of its
/// three tensor views in `bytes`.
fn task_keys(table: &Table<'_>, bytes: &mut [u8]) -> Vec<[u64; 3]> {
    let views = sched::Arena::new(bytes);
    (0..table.tasks().len() as u32)
        .map(|i| {
            let t = kernel_args(table, &views, i).unwrap().tensors;
            [t[0].addr, t[1].addr, t[2].addr]
        })
        .collect()
}

/// The arena bytes an argument touches: every byte of every element of
/// its region, under its tensor's strides.
fn touch(table: &Table<'_>, a: &TensorArg) -> Touch {
    let t = &table.tensors()[a.tensor.get() as usize];
    let size = dtype_size(t.dtype.get()).unwrap();
    let strides = t.strides.map(|s| s.get() as u64);
    let (offset, extent) = (a.offset.map(|v| v.get()), a.extent.map(|v| v.get()));
    let elements = elements(&offset, &extent, &strides);
    Touch {
        elements: elements
            .iter()
            .flat_map(|e| (0..size).map(move |b| t.arena_offset.get() + e * size + b))
            .collect(),
        writes: Access::from_bits_retain(a.access.get()).contains(Access::WRITE),
    }
}

/// For each task, the earlier tasks it must directly follow (see [`Sweep`]).
fn producers(table: &Table<'_>) -> Vec<Vec<u32>> {
    let mut sweep = Sweep::new(table.arena_size() as usize);
    table
        .tasks()
        .iter()
        .map(|task| {
            let touches: Vec<Touch> = table
                .task_args(task)
                .iter()
                .map(|a| touch(table, a))
                .collect();
            sweep.task(&touches)
        })
        .collect()
}

/// Runs the table's tasks one by one in table order on this thread.
fn in_order(table: &Table<'_>, arena: &mut Arena) {
    let views = sched::Arena::new(&mut arena.bytes);
    for (i, task) in table.tasks().iter().enumerate() {
        let info = wsp_ffi::lookup(task.kernel_id.get()).unwrap();
        let args = kernel_args(table, &views, i as u32).unwrap();
        // SAFETY: the views lie inside `arena`, validated by Table::parse, and
        // nothing else touches it while the kernel runs on this thread.
        unsafe { info.invoke(&args) }.unwrap();
    }
}

#[test]
fn random_dags_respect_every_dependency() {
    let seeds = if cfg!(debug_assertions) { 20 } else { 200 };
    for seed in 0..seeds {
        let mut rng = SplitMix64::new(seed);
        let (bytes, arena) = random_program(&mut rng, 150);
        let table = Table::parse(&bytes).unwrap();
        let mut ran = arena.clone();
        let kinds = vec![
            CoreKind::Cube,
            CoreKind::Cube,
            CoreKind::Vector,
            CoreKind::Vector,
            CoreKind::Vector,
        ];
        let mut platform = Adversary::new(kinds, seed, Mode::Random);
        let stats = run(
            &table,
            &mut ran.bytes,
            &mut platform,
            &RunOptions::default(),
        )
        .unwrap();
        assert_eq!(stats.tasks as usize, table.tasks().len());

        // Map events back to tasks: tasks with equal keys conflict (each has
        // a written argument), so they start in table order.
        let keys = task_keys(&table, &mut ran.bytes);
        let mut by_key: HashMap<[u64; 3], VecDeque<usize>> = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            by_key.entry(*k).or_default().push_back(i);
        }
        let mut running: HashMap<[u64; 3], VecDeque<usize>> = HashMap::new();
        let (mut start, mut end) = (vec![usize::MAX; keys.len()], vec![usize::MAX; keys.len()]);
        for (step, (launch, k)) in platform.events.iter().enumerate() {
            if *launch {
                let task = by_key.get_mut(k).unwrap().pop_front().unwrap();
                assert_eq!(start[task], usize::MAX, "task {task} launched twice");
                start[task] = step;
                running.entry(*k).or_default().push_back(task);
            } else {
                let task = running.get_mut(k).unwrap().pop_front().unwrap();
                end[task] = step;
            }
        }
        assert!(
            end.iter().all(|&e| e != usize::MAX),
            "every task finished exactly once"
        );
        let mut ordered_pairs = 0;
        for (t, producers) in producers(&table).iter().enumerate() {
            for &u in producers {
                ordered_pairs += 1;
                assert!(
                    end[u as usize] < start[t],
                    "seed {seed}: task {t} started before task {u} it depends on finished"
                );
            }
        }
        assert!(ordered_pairs > 0);
        // And the data: identical to running the tasks one by one in order.
        let mut expected = arena.clone();
        in_order(&table, &mut expected);
        assert!(
            ran.bytes == expected.bytes,
            "seed {seed}: out-of-order result differs from in-order"
        );
    }
}

fn gemm_table() -> (Vec<u8>, Arena) {
    let w = host_tools::workloads::Workload::build(
        "gemm",
        host_tools::workloads::Params {
            m: 64,
            n: 64,
            k: 64,
            tile: 32,
            seed: 1,
        },
    )
    .unwrap();
    (w.table, w.arena)
}

#[test]
fn a_kernel_kind_without_cores_is_an_error() {
    let (bytes, mut arena) = gemm_table();
    let table = Table::parse(&bytes).unwrap();
    let mut platform = Adversary::new(vec![CoreKind::Vector], 1, Mode::Random);
    let err = run(
        &table,
        &mut arena.bytes,
        &mut platform,
        &RunOptions::default(),
    )
    .unwrap_err();
    assert_eq!(
        err,
        RunError::NoCoreForKind {
            task: 0,
            kernel_id: GEMM,
            kind: CoreKind::Cube
        }
    );
    assert!(err.to_string().contains("needs a Cube core"), "{err}");
}

#[test]
fn a_kernel_that_never_finishes_times_out() {
    let (bytes, mut arena) = gemm_table();
    let table = Table::parse(&bytes).unwrap();
    let mut platform = Adversary::new(vec![CoreKind::Cube], 1, Mode::Never);
    let options = RunOptions {
        kernel_timeout_ms: 50,
        ..RunOptions::default()
    };
    let err = run(&table, &mut arena.bytes, &mut platform, &options).unwrap_err();
    let RunError::KernelTimeout {
        task: 0,
        kernel_id: GEMM,
        core: 0,
        waited_ms,
    } = err
    else {
        panic!("unexpected {err:?}");
    };
    assert!(waited_ms > 50);
    assert!(err.to_string().contains("did not finish within"), "{err}");
}

#[test]
fn a_rejected_kernel_ends_the_run() {
    let (bytes, mut arena) = gemm_table();
    let table = Table::parse(&bytes).unwrap();
    let mut platform = Adversary::new(vec![CoreKind::Cube], 1, Mode::Reject);
    let err = run(
        &table,
        &mut arena.bytes,
        &mut platform,
        &RunOptions::default(),
    )
    .unwrap_err();
    assert_eq!(
        err,
        RunError::KernelRejected {
            task: 0,
            kernel_id: GEMM,
            core: 0
        }
    );
}

#[test]
fn an_arena_smaller_than_the_table_needs() {
    let (bytes, arena) = gemm_table();
    let table = Table::parse(&bytes).unwrap();
    let mut small = vec![0u8; arena.bytes.len() - 4];
    let mut platform = Adversary::new(vec![CoreKind::Cube], 1, Mode::Random);
    let err = run(&table, &mut small, &mut platform, &RunOptions::default()).unwrap_err();
    assert_eq!(
        err,
        RunError::ArenaTooSmall {
            needed: arena.bytes.len() as u64,
            available: small.len() as u64
        }
    );
}

/// `exec::run` with an orchestrator and queues from the kept pairs
/// ([`host_tools::heap::run_state`]; new ones when none is kept).
#[allow(clippy::result_large_err)] // the device's error type, unboxed by design
fn run<P: Platform>(
    table: &Table<'_>,
    arena: &mut [u8],
    platform: &mut P,
    options: &RunOptions,
) -> Result<RunStats, RunError> {
    let mut state = host_tools::heap::run_state();
    let (queues, orch) = state.split();
    exec::run(table, arena, platform, orch, queues, options)
}
