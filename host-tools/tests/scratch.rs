//! Scratch tensors on the heap ring: storage from the first writer to the
//! last reader (or the program's `FREE`), through the whole runtime (shim
//! and semantic time), the arena bytes they save, backpressure when the
//! ring is full, the report when a scope needs more than the ring holds,
//! and tables with bad scratch declarations refused with the field named.

use device_runtime::abi::program::{OP_FREE, OP_HEAP};
use device_runtime::abi::{Problem, Section, Table, TensorDesc, MAX_SCRATCH};
use device_runtime::orch::scratch::ScratchError;
use device_runtime::orch::StallReason;
use device_runtime::sched::{RunError, RunOptions, RunStats};
use host_tools::program::{Axis, Workload as Program};
use host_tools::semantic::run_semantic;
use host_tools::shim::{Shim, ShimError};
use host_tools::summary::heap_figures;
use host_tools::table::{seal, Arena, Arg, BuildError, TableBuilder, TensorLayout};
use host_tools::workloads::{mlp_scratch_heap, Params, Workload};
use wsp_ffi::ArgAccess::{In, Out};
use wsp_ffi::{CoreKind, WspKernelId_WSP_KERNEL_ADD as ADD};

const KINDS: [CoreKind; 4] = [
    CoreKind::Cube,
    CoreKind::Cube,
    CoreKind::Vector,
    CoreKind::Vector,
];

fn run_error(e: ShimError) -> RunError {
    match e {
        ShimError::Run(r) => *r,
        e => panic!("not a run error: {e}"),
    }
}

#[test]
fn mlp_scratch_matches_mlp_with_a_smaller_arena() {
    let p = Params::of("mlp").unwrap();
    let plain = Workload::build("mlp", p).unwrap();
    let scratch = Workload::build("mlp-scratch", p).unwrap();
    // By hand: Y, Z and N are 64 x 128 f32 = 32,768 bytes each (multiples
    // of the 64-byte alignment); the heap ring holds two of them.
    let inter = 64 * 128 * 4;
    assert_eq!(mlp_scratch_heap(64, 128), 2 * inter);
    assert_eq!(
        plain.arena.bytes.len() - scratch.arena.bytes.len(),
        3 * inter as usize - 2 * inter as usize,
        "the arena loses Y, Z and N and gains the ring"
    );
    let out = |w: &Workload, arena: &Arena| -> Vec<f32> {
        let p = w.tensors.iter().find(|t| t.name == "P").unwrap();
        arena.read_f32(p)
    };
    let mut want = plain.arena.clone();
    Shim::default().run(&plain.table, &mut want.bytes).unwrap();
    for threads in [1, 2] {
        let mut shim = Shim::default();
        shim.sched.threads = threads;
        let mut arena = scratch.arena.clone();
        let stats = shim.run(&scratch.table, &mut arena.bytes).unwrap();
        let v = scratch.verify(&arena);
        assert!(v.passed(), "{threads} threads: {v}");
        assert_eq!(
            out(&scratch, &arena),
            out(&plain, &want),
            "bit-identical to mlp"
        );
        let h = heap_figures(&stats).expect("the run reports its heap ring");
        assert_eq!(h.capacity, 2 * inter);
        assert_eq!(h.high_water, 2 * inter, "Y and Z are live together");
        assert_eq!(h.scratch_bytes, 3 * inter);
        assert_eq!(h.arena_saved, inter as i64);
    }
    // Semantic time: the same result, and N's first writer (the first
    // rmsnorm) waits for the last add that reads Y to retire.
    let mut arena = scratch.arena.clone();
    let run = run_semantic(
        &scratch.table,
        &mut arena.bytes,
        &KINDS,
        &RunOptions::default(),
    )
    .unwrap();
    assert!(scratch.verify(&arena).passed());
    let h = heap_figures(&run.stats).unwrap();
    assert_eq!(h.high_water, 2 * inter);
    assert!(h.stalls >= 1, "a HEAP_RING_FULL stall: {h:?}");
    // A table without scratch tensors reports no heap ring.
    let mut arena = plain.arena.clone();
    let run = run_semantic(
        &plain.table,
        &mut arena.bytes,
        &KINDS,
        &RunOptions::default(),
    )
    .unwrap();
    assert_eq!(heap_figures(&run.stats), None);
}

/// N x N tiles: one scratch tensor's storage is 4,096 bytes.
const N: u32 = 32;
const TILE_BYTES: u64 = (N * N * 4) as u64;
const LAYERS: u32 = 4;

/// Per layer l (a parallel loop): H1 = X + X, O1[l] = H1 + X, then
/// H2 = X + X, O2[l] = H2 + X, with H1 and H2 scratch tensors, freed after
/// their reader when `free`.
struct Layers {
    table: Vec<u8>,
    arena: Arena,
    x: TensorLayout,
    outs: [TensorLayout; 2],
}

fn layers(free: bool, heap: u64) -> Layers {
    let mut w = Program::new();
    let x = w.tensor("X", &[N, N]).unwrap();
    let o1 = w.tensor("O1", &[LAYERS * N, N]).unwrap();
    let o2 = w.tensor("O2", &[LAYERS * N, N]).unwrap();
    let h1 = w.scratch("H1", &[N, N]).unwrap();
    let h2 = w.scratch("H2", &[N, N]).unwrap();
    w.heap(heap).unwrap();
    w.parallel(Axis::Dense(LAYERS), |w, l| {
        for (h, o) in [(h1, o1), (h2, o2)] {
            let whole = |t: host_tools::table::TensorId| t.tile(0u32, 0u32, N, N);
            w.call(ADD, &[whole(x), whole(x), whole(h)], &[]);
            w.call(
                ADD,
                &[whole(h), whole(x), o.tile(l.clone() * N, 0u32, N, N)],
                &[],
            );
            if free {
                w.free(h);
            }
        }
    });
    let table = w.finish().unwrap();
    let mut arena = Arena::zeroed(w.arena_size());
    let xs: Vec<f32> = (0..N * N).map(|i| (i % 97) as f32 * 0.25 - 3.0).collect();
    arena.write_f32(w.layout(x), &xs);
    Layers {
        table,
        arena,
        x: w.layout(x).clone(),
        outs: [w.layout(o1).clone(), w.layout(o2).clone()],
    }
}

fn check_layers(l: &Layers, arena: &Arena) {
    let xs = arena.read_f32(&l.x);
    for o in &l.outs {
        let got = arena.read_f32(o);
        for (i, g) in got.iter().enumerate() {
            let x = xs[i % (N * N) as usize];
            assert_eq!(*g, (x + x) + x, "{}[{i}]", o.name);
        }
    }
}

fn heap_of(stats: &RunStats) -> (u64, u64) {
    let r = stats.stalls.of(StallReason::HeapRingFull);
    (r.high_water, r.stalls)
}

#[test]
fn freed_scratch_tensors_take_turns_in_a_ring_of_one() {
    // The ring holds one tile: H2's writer waits until H1's reader has
    // retired, and the next layer's H1 until H2's reader has.
    let l = layers(true, TILE_BYTES);
    assert_eq!(
        l.arena.bytes.len() as u64,
        2 * (LAYERS * N * N * 4) as u64 + TILE_BYTES + TILE_BYTES,
        "X, O1, O2 and the ring"
    );
    let mut arena = l.arena.clone();
    let stats = Shim::default().run(&l.table, &mut arena.bytes).unwrap();
    assert_eq!(stats.tasks, 4 * LAYERS as u64);
    check_layers(&l, &arena);
    assert_eq!(heap_of(&stats).0, TILE_BYTES);
    let mut arena = l.arena.clone();
    let run = run_semantic(&l.table, &mut arena.bytes, &KINDS, &RunOptions::default()).unwrap();
    check_layers(&l, &arena);
    let (high, stalls) = heap_of(&run.stats);
    assert_eq!(high, TILE_BYTES);
    assert!(
        stalls >= 2 * LAYERS as u64 - 1,
        "each writer but the first waits for the ring: {stalls} stalls"
    );
}

#[test]
fn a_scope_larger_than_the_ring_ends_with_a_report_naming_the_tensor() {
    // Without FREE, H1 lives to the end of the run and H2 never fits.
    let l = layers(false, TILE_BYTES);
    let mut arena = l.arena.clone();
    let e = run_error(Shim::default().run(&l.table, &mut arena.bytes).unwrap_err());
    let RunError::Scratch(ScratchError::DoesNotFit {
        task,
        tensor,
        name,
        requested,
        used,
        capacity,
        live,
        oldest,
    }) = e
    else {
        panic!("not a heap ring report: {e}");
    };
    assert_eq!((task, tensor), (2, 4), "H2's first writer, task 2");
    assert_eq!(&name[..2], b"H2");
    assert_eq!(
        (requested, used, capacity),
        (TILE_BYTES, TILE_BYTES, TILE_BYTES)
    );
    assert_eq!((live, oldest), (1, Some(3)), "H1 holds the ring");
    let text = e.to_string();
    assert!(
        text.contains("scratch tensor 4 `H2`") && text.contains("enlarge HEAP"),
        "{text}"
    );
    // The same in semantic time; and with room for both, the run passes.
    let mut arena = l.arena.clone();
    let e = run_semantic(&l.table, &mut arena.bytes, &KINDS, &RunOptions::default()).unwrap_err();
    assert!(matches!(
        run_error(e),
        RunError::Scratch(ScratchError::DoesNotFit { tensor: 4, .. })
    ));
    let l = layers(false, 2 * TILE_BYTES);
    let mut arena = l.arena.clone();
    Shim::default().run(&l.table, &mut arena.bytes).unwrap();
    check_layers(&l, &arena);
}

#[test]
fn reading_a_scratch_tensor_nothing_wrote_is_an_error() {
    let mut b = TableBuilder::new();
    let x = b.tensor("X", &[N, N]).unwrap();
    let h = b.scratch("H", &[N, N]).unwrap();
    let y = b.tensor("Y", &[N, N]).unwrap();
    b.heap(TILE_BYTES).unwrap();
    let t = |id, acc| Arg::tile(id, acc, 0, 0, N, N);
    b.task(ADD, &[t(h, In), t(x, In), t(y, Out)], &[]).unwrap();
    let table = b.finish().unwrap();
    let mut arena = Arena::zeroed(b.arena_size());
    let e = run_error(Shim::default().run(&table, &mut arena.bytes).unwrap_err());
    assert!(
        matches!(
            e,
            RunError::Scratch(ScratchError::ReadBeforeWrite {
                task: 0,
                tensor: 1,
                ..
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("`H`, which no task wrote"), "{e}");
}

/// A table with one scratch tensor `H` (tensor 1) written by task 0 and
/// read by task 1, heap ring of `heap` bytes.
fn small(heap: u64, shape: [u32; 2]) -> Vec<u8> {
    let mut b = TableBuilder::new();
    let x = b.tensor("X", &[N, N]).unwrap();
    let h = b.scratch("H", &shape).unwrap();
    let y = b.tensor("Y", &[N, N]).unwrap();
    b.heap(heap).unwrap();
    let t = |id, acc| Arg::tile(id, acc, 0, 0, N, N);
    b.task(ADD, &[t(x, In), t(x, In), t(h, Out)], &[]).unwrap();
    b.task(ADD, &[t(h, In), t(x, In), t(y, Out)], &[]).unwrap();
    b.finish().unwrap()
}

fn refused(table: &[u8]) -> (Section, u32, &'static str, Problem) {
    let e = Table::parse(table).expect_err("refused");
    (e.section, e.index, e.field, e.problem)
}

/// Offset of the program's `HEAP` instruction in the table.
fn heap_instr(table: &[u8]) -> usize {
    let t = Table::parse(table).unwrap();
    let at = t.program().iter().position(|i| i.op == OP_HEAP).unwrap();
    let start = t.header().program.offset.get() as usize;
    start + at * 16
}

#[test]
fn bad_scratch_declarations_are_refused_naming_the_field() {
    let good = small(TILE_BYTES, [N, N]);
    Table::parse(&good).unwrap();
    // The builder refuses scratch tensors without a heap ring, and a heap
    // that is not a multiple of 64.
    let mut b = TableBuilder::new();
    b.scratch("H", &[N, N]).unwrap();
    assert_eq!(b.finish().unwrap_err(), BuildError::NoHeap(0));
    assert_eq!(b.heap(100).unwrap_err(), BuildError::NoHeap(100));
    // A scratch tensor larger than the ring.
    let big = small(TILE_BYTES, [2 * N, N]);
    assert_eq!(
        refused(&big),
        (
            Section::Tensors,
            1,
            "shape",
            Problem::OutOfRange {
                value: 2 * TILE_BYTES,
                min: 0,
                max: TILE_BYTES
            }
        )
    );
    // A scratch tensor whose size in bytes does not fit in 64 bits (rows
    // of 2^31 elements, 2^31 + 1 of them): the shape's fault, named as an
    // overflow (it was `value 18446744073709551615 outside [0, ARENA]`).
    let mut t = good.clone();
    let at = Table::parse(&good).unwrap().header().tensors.offset.get() as usize
        + size_of::<TensorDesc>();
    for (field, value) in [(24, (1u32 << 31) + 1), (40, 1 << 31)] {
        t[at + field..at + field + 4].copy_from_slice(&value.to_le_bytes());
    }
    seal(&mut t);
    assert_eq!(
        refused(&t),
        (Section::Tensors, 1, "shape", Problem::SizeOverflow)
    );
    // HEAP of 100 bytes (patched past the builder) and of 0.
    let at = heap_instr(&good);
    for (bytes, min) in [(100u32, 64u64), (0, 64)] {
        let mut t = good.clone();
        t[at + 8..at + 12].copy_from_slice(&bytes.to_le_bytes());
        seal(&mut t);
        let (section, _, field, problem) = refused(&t);
        assert_eq!((section, field), (Section::Program, "imm"));
        assert!(
            matches!(problem, Problem::OutOfRange { value, min: m, .. } if value == bytes as u64 && m == min)
        );
    }
    // HEAP turned into FREE of tensor 4096 bytes..: FREE of an arena tensor.
    let mut t = good.clone();
    t[at] = OP_FREE;
    t[at + 8..at + 12].copy_from_slice(&0u32.to_le_bytes());
    seal(&mut t);
    let (section, _, field, problem) = refused(&t);
    assert_eq!((section, field), (Section::Program, "imm"));
    assert_eq!(
        problem,
        Problem::Scratch {
            tensor: 0,
            scratch: false
        }
    );
    // The same FREE naming the scratch tensor, but no HEAP left.
    t[at + 8..at + 12].copy_from_slice(&1u32.to_le_bytes());
    seal(&mut t);
    assert_eq!(
        refused(&t),
        (Section::Tensors, 1, "arena_offset", Problem::NoHeap)
    );
    // An arena tensor reaching into the ring: a header whose arena is 64
    // bytes short moves the ring over Y's last bytes. The error names Y's
    // offset, its size and where the ring starts (it named Y's end as the
    // offset's value: `value 8192 outside [0, 8128]`).
    let mut t = good.clone();
    let size = u64::from_le_bytes(t[24..32].try_into().unwrap());
    let y = Table::parse(&good).unwrap().tensors()[2].arena_offset.get();
    t[24..32].copy_from_slice(&(size - 64).to_le_bytes());
    seal(&mut t);
    let e = Table::parse(&t).expect_err("refused");
    assert_eq!(
        (e.section, e.index, e.field, e.problem),
        (
            Section::Tensors,
            2,
            "arena_offset",
            Problem::IntoHeapRing {
                offset: y,
                bytes: TILE_BYTES,
                heap_start: size - 64 - TILE_BYTES
            }
        )
    );
    assert!(
        e.to_string().contains(&format!(
            "the tensor's {TILE_BYTES} bytes at offset {y} end at {}, inside the heap ring, which starts at {}",
            y + TILE_BYTES,
            size - 64 - TILE_BYTES
        )),
        "{e}"
    );
    // A header arena size that is not a multiple of 4 puts the ring's
    // start, and its blocks, off their alignment: the arena size is named
    // with its own value (the ring's start was named as its value).
    let mut t = good.clone();
    t[24..32].copy_from_slice(&(size + 2).to_le_bytes());
    seal(&mut t);
    let e = Table::parse(&t).expect_err("refused");
    assert_eq!(
        (e.section, e.field, e.problem),
        (
            Section::Header,
            "arena_size",
            Problem::Misaligned {
                value: size + 2,
                align: 4
            }
        )
    );
    assert!(
        e.to_string().contains(&format!(
            "value {} is misaligned: it must be a multiple of 4",
            size + 2
        )),
        "{e}"
    );
    // More scratch tensors than the runtime tracks.
    let mut b = TableBuilder::new();
    for i in 0..=MAX_SCRATCH {
        b.scratch(&format!("S{i}"), &[1, 16]).unwrap();
    }
    b.heap(64).unwrap();
    let t = b.finish().unwrap();
    assert_eq!(
        refused(&t),
        (
            Section::Tensors,
            MAX_SCRATCH as u32,
            "arena_offset",
            Problem::TooManyScratch {
                max: MAX_SCRATCH as u32
            }
        )
    );
}

/// The layer loop of [`layers`] as a workload file: `scratch = true`
/// tensors, `[schedule] heap` and `free` steps.
const LAYERS_TOML: &str = r#"
name = "layers"

[tensors]
X = { shape = [32, 32], init = "random", seed = 3 }
O1 = { shape = [128, 32] }
O2 = { shape = [128, 32] }
H1 = { shape = [32, 32], scratch = true }
H2 = { shape = [32, 32], scratch = true }

[schedule]
heap = 4096

[[body]]
parallel = "l"
dense = 4
body = [
  { call = "add", args = ["X[0, 0; 32 x 32]", "X[0, 0; 32 x 32]", "H1[0, 0; 32 x 32]"] },
  { call = "add", args = ["H1[0, 0; 32 x 32]", "X[0, 0; 32 x 32]", "O1[l * 32, 0; 32 x 32]"] },
  { free = "H1" },
  { call = "add", args = ["X[0, 0; 32 x 32]", "X[0, 0; 32 x 32]", "H2[0, 0; 32 x 32]"] },
  { call = "add", args = ["H2[0, 0; 32 x 32]", "X[0, 0; 32 x 32]", "O2[l * 32, 0; 32 x 32]"] },
  { free = "H2" },
]
"#;

#[test]
fn a_workload_file_declares_scratch_tensors_heap_and_free() {
    use host_tools::workload_file::WorkloadFile;
    let w = WorkloadFile::parse(LAYERS_TOML)
        .unwrap()
        .build(&[])
        .unwrap();
    assert_eq!(
        w.arena.bytes.len() as u64,
        2 * (LAYERS * N * N * 4) as u64 + TILE_BYTES + TILE_BYTES,
        "X, O1, O2 and the ring: H1 and H2 take no arena bytes"
    );
    let mut arena = w.arena.clone();
    let stats = Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    let checks = w.check(&arena);
    assert!(checks.iter().all(|v| v.passed()), "{checks:?}");
    assert!(
        checks.iter().any(|v| v.output == "O2"),
        "the outputs are checked: {checks:?}"
    );
    assert_eq!(heap_of(&stats).0, TILE_BYTES);
    // H1 and H2 are written once in each of the 4 layers, after each
    // `free`: 8 scopes of one tile each took storage in turn from a ring
    // of one tile, which saved 7 tiles of arena (the declared tensors,
    // two tiles, would count as 1 saved).
    assert_eq!(stats.scratch_bytes, 2 * LAYERS as u64 * TILE_BYTES);
    let saved = host_tools::summary::heap_figures(&stats)
        .unwrap()
        .arena_saved;
    assert_eq!(saved, 7 * TILE_BYTES as i64);
    // Without the frees, H2 never fits: the report names it.
    let text = LAYERS_TOML
        .replace("  { free = \"H1\" },\n", "")
        .replace("  { free = \"H2\" },\n", "");
    let w = WorkloadFile::parse(&text).unwrap().build(&[]).unwrap();
    let mut arena = w.arena.clone();
    let e = run_error(Shim::default().run(&w.table, &mut arena.bytes).unwrap_err());
    assert!(e.to_string().contains("`H2`"), "{e}");
    // Bad declarations are refused with the cause.
    for (from, to, says) in [
        ("heap = 4096", "heap = 100", "heap of 100 bytes"),
        (
            "H1 = { shape = [32, 32], scratch = true }",
            "H1 = { shape = [32, 32], scratch = true, input = true }",
            "no initial data",
        ),
        (
            "{ free = \"H1\" }",
            "{ free = \"X\" }",
            "only scratch tensors",
        ),
    ] {
        let text = LAYERS_TOML.replace(from, to);
        let e = match WorkloadFile::parse(&text).and_then(|f| f.build(&[]).map(|_| ())) {
            Ok(()) => panic!("{to}: accepted"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(says), "{to}: {e}");
    }
}
