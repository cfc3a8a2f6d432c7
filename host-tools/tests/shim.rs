//! The host shim runs every workload correctly, and the result does not
//! depend on how many cores run it (dependency order fixes every result).

use device_runtime::sched::RunError;
use host_tools::pinning::{processors, Placement};
use host_tools::shim::{Shim, ShimError};
use host_tools::workloads::{Params, Workload, NAMES};

fn run(w: &Workload, cube: usize, vector: usize) -> Vec<u8> {
    let mut arena = w.arena.clone();
    let shim = Shim {
        cube_cores: cube,
        vector_cores: vector,
        ..Shim::default()
    };
    let stats = shim.run(&w.table, &mut arena.bytes).unwrap();
    assert_eq!(stats.tasks as usize, w.tasks);
    assert_eq!(stats.cores().len(), cube + vector);
    let check = w.verify(&arena);
    assert!(
        check.passed(),
        "{} on {cube}+{vector} cores: {check}",
        w.name
    );
    arena.bytes
}

#[test]
fn every_workload_passes_and_core_count_does_not_change_a_bit() {
    for name in NAMES {
        // The MoE router takes at most 64 tokens and the expert kernel
        // 64-wide rows.
        let (m, n, k) = if name.starts_with("moe") {
            (48, 64, 64)
        } else if name.starts_with("decode-layer") || name == "stitched" {
            // 8 requests up to 100 tokens, hidden 128 (heads of 64).
            (8, 100, 128)
        } else if name == "pipeline" {
            // Square tiles: 4 of 32 x 32.
            (128, 32, 32)
        } else {
            (128, 128, 96)
        };
        let p = Params {
            m,
            n,
            k,
            tile: 32,
            seed: 5,
        };
        // The attention pipeline's sizes are its own (16 query rows at
        // most), and v9's examples' are fixed.
        let p = if name == "attention-pipeline" || name.starts_with("wsp9-") {
            Params {
                seed: 5,
                ..Params::of(name).unwrap()
            }
        } else {
            p
        };
        let w = Workload::build(name, p).unwrap_or_else(|e| panic!("{name}: {e}"));
        let one = run(&w, 1, 1);
        let many = run(&w, 4, 4);
        assert!(one == many, "{name}: 1+1 and 4+4 cores differ");
    }
}

#[test]
fn a_failed_check_is_reported() {
    let w = Workload::build(
        "gemm",
        Params {
            m: 64,
            n: 64,
            k: 64,
            tile: 32,
            seed: 2,
        },
    )
    .unwrap();
    let mut arena = w.arena.clone();
    Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    let c = w.tensors.iter().find(|t| t.name == "C").unwrap().clone();
    let mut values = arena.read_f32(&c);
    values[100] += 1e-3;
    arena.write_f32(&c, &values);
    let check = w.verify(&arena);
    assert!(!check.passed(), "{check}");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let w = Workload::build(
        "gemm",
        Params {
            m: 64,
            n: 64,
            k: 64,
            tile: 32,
            seed: 2,
        },
    )
    .unwrap();
    let err = Shim::default()
        .run(&w.table[..100], &mut w.arena.clone().bytes)
        .unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    let no_cube = Shim {
        cube_cores: 0,
        vector_cores: 2,
        ..Shim::default()
    };
    let err = no_cube
        .run(&w.table, &mut w.arena.clone().bytes)
        .unwrap_err();
    assert!(err.to_string().contains("needs a Cube core"), "{err}");
    assert!(Workload::build("nope", Params::default()).is_err());
    assert!(Workload::build(
        "gemm",
        Params {
            tile: 65,
            ..Params::default()
        }
    )
    .is_err());
    assert!(Workload::build(
        "gemm",
        Params {
            m: 100,
            ..Params::default()
        }
    )
    .is_err());
}

/// An arena that does not start at a multiple of the element alignment is
/// refused before any kernel sees a misaligned view (kernels assume
/// naturally aligned elements; on x86 a misaligned run would even "work").
#[test]
fn a_misaligned_arena_is_refused() {
    let w = Workload::build("gemm", Params::of("gemm").unwrap()).unwrap();
    let len = w.arena.bytes.len();
    let mut buffer = vec![0u8; len + 8];
    // The first byte at an address 1 past a multiple of 4.
    let skip = (5 - buffer.as_ptr() as usize % 4) % 4;
    let skip = if skip == 0 { 4 } else { skip };
    let arena = &mut buffer[skip..skip + len];
    assert_eq!(arena.as_ptr() as usize % 4, 1);
    arena.copy_from_slice(&w.arena.bytes);
    let err = Shim::default().run(&w.table, arena).unwrap_err();
    assert_eq!(
        err,
        ShimError::Run(Box::new(RunError::ArenaMisaligned {
            align: device_runtime::abi::ARENA_ALIGN
        }))
    );
    assert!(err.to_string().contains("multiple of 4 bytes"), "{err}");
}

/// A workload's own default sizes apply unless sizes are given; a seed
/// changes only the data, and given sizes are honoured even when they equal
/// another workload's defaults.
#[test]
fn a_seed_changes_the_data_only_and_given_sizes_are_honoured() {
    for name in NAMES {
        let defaults = Params::of(name).unwrap();
        let one = Workload::build(name, defaults).unwrap();
        let two = Workload::build(
            name,
            Params {
                seed: 2,
                ..defaults
            },
        )
        .unwrap();
        assert_eq!(one.summary, two.summary, "{name}: the same sizes");
        assert_eq!(one.table, two.table, "{name}: the same table");
        assert_ne!(one.arena.bytes, two.arena.bytes, "{name}: other data");
    }
    // mlp's defaults are 64 x 128 x 128; 256 x 256 x 256 given is built.
    let big = Params {
        m: 256,
        n: 256,
        k: 256,
        tile: 32,
        seed: 1,
    };
    let mlp = Workload::build("mlp", big).unwrap();
    assert!(mlp.summary.contains("X[256x256]"), "{}", mlp.summary);
    assert_eq!(Params::of("mlp").unwrap().m, 64);
    assert!(Params::of("nope").is_err());
}

/// A pinned run computes what an unpinned one does and gives the calling
/// thread (scheduler thread 0, pinned during the run) its processors
/// back; with more threads than processors it is refused with the cause
/// (also checked in `pinning`'s own tests, which do not depend on
/// `MAX_THREADS`).
#[cfg(target_os = "linux")]
#[test]
fn a_pinned_run_computes_the_same_and_gives_the_caller_its_processors_back() {
    let w = Workload::build(
        "gemm",
        Params {
            m: 128,
            n: 128,
            k: 96,
            tile: 32,
            seed: 4,
        },
    )
    .unwrap();
    let available = processors().unwrap();
    let threads = available.len().min(2);
    let shim = |placement| Shim {
        cube_cores: 2,
        vector_cores: 2,
        placement,
        sched: device_runtime::sched::SchedConfig {
            threads,
            ..Default::default()
        },
        ..Shim::default()
    };
    let mut pinned = w.arena.clone();
    let stats = shim(Placement::Pinned)
        .run(&w.table, &mut pinned.bytes)
        .unwrap();
    assert_eq!(stats.tasks as usize, w.tasks);
    let check = w.verify(&pinned);
    assert!(check.passed(), "pinned: {check}");
    assert_eq!(processors().unwrap(), available, "the caller's set is back");
    // So is every worker thread's, which later runs borrow: eight jobs
    // take the eight workers that became idle last (the pinned run's
    // among them, unless another test's run took it meanwhile; without
    // the restore it may use one processor).
    let sets = host_tools::workers::scope(|s| {
        let jobs: Vec<_> = (0..8).map(|_| s.spawn("wsp-test", processors)).collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(sets.iter().all(|s| *s == available), "{sets:?}");
    let mut free = w.arena.clone();
    shim(Placement::Os).run(&w.table, &mut free.bytes).unwrap();
    assert!(
        pinned.bytes == free.bytes,
        "pinned and unpinned runs differ"
    );

    // More threads than this thread may use processors: refused, nothing run.
    let set = processors().unwrap();
    if set.len() < device_runtime::sched::MAX_THREADS {
        let too_many = Shim {
            sched: device_runtime::sched::SchedConfig {
                threads: set.len() + 1,
                ..Default::default()
            },
            ..shim(Placement::Pinned)
        };
        let mut arena = w.arena.clone();
        match too_many.run(&w.table, &mut arena.bytes) {
            Err(ShimError::Pin(e)) => assert!(
                e.to_string()
                    .contains(&format!("may use {} processors", set.len())),
                "{e}"
            ),
            other => panic!("expected a pinning error, got {other:?}"),
        }
    }
}

/// A platform whose cores complete every launch at once and that records
/// the name of each thread that launches on it.
struct NamingCores {
    busy: u64,
    names: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    clock: host_tools::shim::HostClock,
}

impl device_runtime::platform::Clock for NamingCores {
    fn now(&self) -> u64 {
        self.clock.now()
    }
    fn ticks_per_second(&self) -> u64 {
        self.clock.ticks_per_second()
    }
    fn relax(&self) {
        self.clock.relax()
    }
    fn pause(&self) {
        self.clock.pause()
    }
}

impl device_runtime::platform::Platform for NamingCores {
    fn num_cores(&self) -> usize {
        2
    }
    fn core_kind(&self, _: usize) -> wsp_ffi::CoreKind {
        wsp_ffi::CoreKind::Vector
    }
    /// # Safety
    ///
    /// None needed here: the arguments' pointers are never read.
    unsafe fn launch(&mut self, core: usize, _: u32, _: &wsp_ffi::WspKernelArgs) -> bool {
        if self.busy & (1 << core) != 0 {
            return false;
        }
        self.busy |= 1 << core;
        // The name the OS keeps, which profilers show (a worker thread
        // lent to the run carries the job's name only there).
        let name = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        self.names
            .lock()
            .unwrap()
            .insert(name.trim_end().to_string());
        true
    }
    fn poll(&mut self, core: usize) -> Option<device_runtime::platform::Completion> {
        if self.busy & (1 << core) == 0 {
            return None;
        }
        self.busy &= !(1 << core);
        Some(device_runtime::platform::Completion::Done { cycles: 0 })
    }
}

/// Scheduler threads carry names (thread 0 is the caller's), so that a
/// profiler or a debugger tells them apart (`perf report --sort comm`),
/// also when the thread is a worker kept from an earlier run: two runs.
#[cfg(target_os = "linux")]
#[test]
fn scheduler_threads_are_named() {
    use device_runtime::sched::{PolicyKind, RunOptions, SchedConfig};
    use host_tools::table::{Arg, TableBuilder};
    use wsp_ffi::ArgAccess::{In, Out};

    let mut b = TableBuilder::new();
    let x = b.tensor("x", &[1, 1]).unwrap();
    let out = b.tensor("out", &[1, 64]).unwrap();
    for i in 0..64 {
        let args = [
            Arg::tile(x, In, 0, 0, 1, 1),
            Arg::tile(x, In, 0, 0, 1, 1),
            Arg::tile(out, Out, 0, i, 1, 1),
        ];
        b.task(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args, &[])
            .unwrap();
    }
    let table = b.finish().unwrap();
    let mut arena = vec![0u8; b.arena_size() as usize];
    let table = device_runtime::abi::Table::parse(&table).unwrap();
    let names = std::sync::Arc::default();
    let clock = host_tools::shim::HostClock::new();
    // Round-robin places every other task on thread 1, which issues it.
    let sched = SchedConfig {
        threads: 2,
        policy: PolicyKind::RoundRobin,
        ..SchedConfig::default()
    };
    for _run in 0..2 {
        let platforms = (0..2)
            .map(|_| NamingCores {
                busy: 0,
                names: std::sync::Arc::clone(&names),
                clock: clock.clone(),
            })
            .collect();
        let stats = host_tools::shim::run_threads_placed(
            &table,
            &mut arena,
            platforms,
            &[vec![0, 1], vec![2, 3]],
            &sched,
            &RunOptions::default(),
            Placement::Os,
        )
        .unwrap();
        assert_eq!(stats.tasks, 64);
        let mut names = names.lock().unwrap();
        assert!(names.contains("wsp-sched-1"), "launched from {names:?}");
        assert!(!names.contains("wsp-worker"), "launched from {names:?}");
        names.clear();
    }
}
