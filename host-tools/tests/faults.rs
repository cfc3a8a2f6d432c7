//! Faults end runs cleanly on the host shim: a kernel's error code, a core
//! that never acknowledges a task, one that never finishes it, and a kernel
//! not built into a core each end the run within its bound with a typed
//! error naming the task, the kernel (id and name) and the core; the next
//! run of the same table in the same process is clean and correct.

use std::time::{Duration, Instant};

use device_runtime::abi::program::OP_CALL;
use device_runtime::abi::Table;
use device_runtime::fault::{Fault, FaultKind, Trigger};
use device_runtime::sched::{RunError, RunOptions};
use host_tools::shim::{Shim, ShimError};
use host_tools::workloads::{Params, Workload};

/// The faulty runs' timeouts, which they wait for: short enough for a
/// quick test, long enough that a healthy core which the host stops for
/// a moment (a loaded or throttled machine) is not taken for a hung one.
/// The clean runs keep the default timeouts. (The timeout arithmetic
/// itself is checked without a wall clock, in semantic time, below.)
const ACK_MS: u64 = 800;
const KERNEL_MS: u64 = 2_000;
/// A generous bound on a faulty run's wall time (its timeouts, the drain
/// after the error, host noise), below the default 10 s kernel timeout.
const BOUND: Duration = Duration::from_secs(9);

/// One cube core (0) and one vector core (1): every task's core is known.
fn shim() -> Shim {
    Shim {
        cube_cores: 1,
        vector_cores: 1,
        ..Shim::default()
    }
}

/// [`shim`] with the faulty runs' timeouts.
fn faulty_shim() -> Shim {
    Shim {
        options: RunOptions {
            kernel_timeout_ms: KERNEL_MS,
            ack_timeout_ms: ACK_MS,
            ..RunOptions::default()
        },
        ..shim()
    }
}

fn mlp() -> Workload {
    let p = Params {
        m: 64,
        n: 64,
        k: 64,
        tile: 32,
        seed: 3,
    };
    Workload::build("mlp", p).unwrap()
}

/// The kernel of task `task` of the tasks section, from the table.
fn kernel_of(w: &Workload, task: u32) -> u32 {
    let table = Table::parse(&w.table).unwrap();
    table.tasks()[task as usize].kernel_id.get()
}

/// The kernel's name in the registry.
fn name(kernel_id: u32) -> &'static str {
    wsp_ffi::lookup(kernel_id).unwrap().name
}

/// Runs `w` with `fault`, checks it ends within [`BOUND`] with an error,
/// then runs it again without the fault in the same process and checks a
/// correct result, bit-identical to a run that never saw a fault. Returns
/// the error and its text.
fn faulty_then_clean(w: &Workload, fault: Fault) -> (RunError, String) {
    let shim = shim();
    let mut reference = w.arena.clone();
    shim.run(&w.table, &mut reference.bytes).unwrap();
    let mut arena = w.arena.clone();
    let start = Instant::now();
    let result = faulty_shim().run_with_fault(&w.table, &mut arena.bytes, fault);
    let took = start.elapsed();
    let Err(ShimError::Run(e)) = result else {
        panic!("{fault}: the run did not fail: {result:?}");
    };
    assert!(took < BOUND, "{fault}: the run took {took:?}");
    let mut again = w.arena.clone();
    let stats = shim.run(&w.table, &mut again.bytes).unwrap();
    assert_eq!(stats.tasks as usize, w.tasks);
    let check = w.verify(&again);
    assert!(check.passed(), "{fault}: the run after it: {check}");
    assert!(
        again.bytes == reference.bytes,
        "{fault}: the run after it differs"
    );
    let text = ShimError::Run(e.clone()).to_string();
    (*e, text)
}

/// The error text names the task, the kernel (id and name) and the core.
fn assert_names(text: &str, task: u32, kernel_id: u32, core: u32) {
    for part in [
        format!("task {task} "),
        format!("kernel {kernel_id} ({})", name(kernel_id)),
        format!("core {core}"),
    ] {
        assert!(text.contains(&part), "{text:?} lacks {part:?}");
    }
}

#[test]
fn a_kernel_error_code_ends_the_run_naming_task_kernel_core_and_code() {
    let w = mlp();
    let fault = Fault {
        kind: FaultKind::Error(42),
        core: 1,
        trigger: Trigger::Nth(2),
    };
    let (e, text) = faulty_then_clean(&w, fault);
    let RunError::KernelFailed {
        task,
        kernel_id,
        core,
        code,
    } = e
    else {
        panic!("{text}");
    };
    assert_eq!((core, code), (1, 42), "{text}");
    assert_eq!(kernel_id, kernel_of(&w, task), "{text}");
    assert_names(&text, task, kernel_id, core);
    assert!(text.contains("error code 42"), "{text}");
}

#[test]
fn a_core_that_never_acknowledges_ends_the_run_after_the_ack_timeout() {
    let w = mlp();
    let fault = Fault {
        kind: FaultKind::NoAck,
        core: 0,
        trigger: Trigger::Nth(1),
    };
    let (e, text) = faulty_then_clean(&w, fault);
    let RunError::CoreNoAck {
        task,
        kernel_id,
        core,
        waited_ms,
    } = e
    else {
        panic!("{text}");
    };
    assert_eq!(core, 0, "{text}");
    assert!(
        (ACK_MS..KERNEL_MS).contains(&waited_ms),
        "{text}: the ack timeout, not the kernel timeout"
    );
    assert_eq!(kernel_id, kernel_of(&w, task), "{text}");
    assert_names(&text, task, kernel_id, core);
    assert!(text.contains("did not acknowledge"), "{text}");
}

#[test]
fn a_core_that_never_finishes_ends_the_run_after_the_kernel_timeout() {
    let w = mlp();
    let gemm = wsp_ffi::WspKernelId_WSP_KERNEL_GEMM_TILE;
    let fault = Fault {
        kind: FaultKind::NoFin,
        core: 0,
        trigger: Trigger::Kernel(gemm),
    };
    let (e, text) = faulty_then_clean(&w, fault);
    let RunError::KernelTimeout {
        task,
        kernel_id,
        core,
        waited_ms,
    } = e
    else {
        panic!("{text}");
    };
    assert_eq!((kernel_id, core), (gemm, 0), "{text}");
    assert!(waited_ms >= KERNEL_MS, "{text}");
    assert_eq!(kernel_id, kernel_of(&w, task), "{text}");
    assert_names(&text, task, kernel_id, core);
    assert!(text.contains("did not finish"), "{text}");
}

#[test]
fn a_kernel_not_built_in_ends_the_run_before_anything_runs() {
    let w = mlp();
    let gemm = wsp_ffi::WspKernelId_WSP_KERNEL_GEMM_TILE;
    let fault = Fault {
        kind: FaultKind::NotBuiltIn,
        core: 0,
        trigger: Trigger::Kernel(gemm),
    };
    let (e, text) = faulty_then_clean(&w, fault);
    let first = Table::parse(&w.table)
        .unwrap()
        .tasks()
        .iter()
        .position(|t| t.kernel_id.get() == gemm)
        .unwrap() as u32;
    assert_eq!(
        e,
        RunError::KernelNotBuiltIn {
            kernel_id: gemm,
            core: 0,
            task: Some(first),
            pc: None
        },
        "{text}"
    );
    assert_names(&text, first, gemm, 0);
    // Nothing ran: the arena is as it was.
    let mut arena = w.arena.clone();
    let result = faulty_shim().run_with_fault(&w.table, &mut arena.bytes, fault);
    assert!(result.is_err());
    assert!(arena.bytes == w.arena.bytes, "a task ran before the check");
}

#[test]
fn a_program_call_of_a_kernel_not_built_in_is_named_by_its_pc() {
    let w = Workload::build("decode-device", Params::of("decode-device").unwrap()).unwrap();
    let table = Table::parse(&w.table).unwrap();
    assert!(table.tasks().is_empty(), "a program-only table");
    let (pc, call) = (table.program().iter().enumerate())
        .find(|(_, i)| i.op == OP_CALL)
        .unwrap();
    let kernel_id = call.imm.get();
    let kind = wsp_ffi::lookup(kernel_id).unwrap().kind;
    let core = kind as usize; // one core of each kind: cube 0, vector 1
    assert_eq!(shim().core_kinds()[core], kind);
    let fault = Fault {
        kind: FaultKind::NotBuiltIn,
        core,
        trigger: Trigger::Kernel(kernel_id),
    };
    let (e, text) = faulty_then_clean(&w, fault);
    assert_eq!(
        e,
        RunError::KernelNotBuiltIn {
            kernel_id,
            core: core as u32,
            task: None,
            pc: Some(pc as u32)
        },
        "{text}"
    );
    assert!(text.contains(&format!("instruction {pc}")), "{text}");
    assert!(text.contains(&format!("kernel {kernel_id} ({})", name(kernel_id))));
}

#[test]
fn faults_have_a_text_form() {
    // Error code 0 included: a kernel returning `kernel_failed(0)` fails.
    for text in [
        "no-ack:0:1",
        "no-fin:3:k2",
        "error:1:2:42",
        "error:0:1:0",
        "no-kernel:0:2",
    ] {
        let fault = Fault::parse(text).unwrap();
        assert_eq!(fault.to_string(), text);
    }
    assert_eq!(
        Fault::parse("error:1:k7:9"),
        Ok(Fault {
            kind: FaultKind::Error(9),
            core: 1,
            trigger: Trigger::Kernel(7)
        })
    );
    for bad in [
        "",
        "no-ack",
        "no-ack:0",
        "no-ack:0:0",
        "hang:0:1",
        "error:0:1",
        "no-fin:0:1:2",
    ] {
        assert!(Fault::parse(bad).is_err(), "{bad:?}");
    }
}

/// In semantic time a task that never finishes (or is never taken) ends
/// the run by its timeout on the semantic clock, which moves while no task
/// is on any core; the default 10 s timeout passes in little wall time.
/// Two scheduler threads: the fault's core (3) is not scheduler 0's.
#[test]
fn in_semantic_time_a_hung_core_ends_the_run_by_its_timeout() {
    use device_runtime::sched::SchedConfig;
    use host_tools::semantic::{run_semantic_with, run_semantic_with_fault};
    use wsp_ffi::CoreKind::{Cube, Vector};
    let w = mlp();
    let kinds = [Cube, Cube, Vector, Vector];
    let sched = SchedConfig {
        threads: 2,
        ..SchedConfig::default()
    };
    let options = RunOptions::default();
    let mut clean = w.arena.clone();
    run_semantic_with(&w.table, &mut clean.bytes, &kinds, &sched, &options).unwrap();
    for (kind, timeout) in [
        (FaultKind::NoFin, options.kernel_timeout_ms),
        (FaultKind::NoAck, options.ack_timeout_ms),
    ] {
        let fault = Fault {
            kind,
            core: 3,
            trigger: Trigger::Nth(1),
        };
        let mut arena = w.arena.clone();
        let start = Instant::now();
        let result =
            run_semantic_with_fault(&w.table, &mut arena.bytes, &kinds, &sched, &options, fault);
        assert!(start.elapsed() < BOUND, "{fault}: {:?}", start.elapsed());
        let Err(ShimError::Run(e)) = result else {
            panic!("{fault}: {result:?}");
        };
        let (core, waited_ms) = match *e {
            RunError::KernelTimeout {
                core, waited_ms, ..
            } if kind == FaultKind::NoFin => (core, waited_ms),
            RunError::CoreNoAck {
                core, waited_ms, ..
            } if kind == FaultKind::NoAck => (core, waited_ms),
            e => panic!("{fault}: {e}"),
        };
        assert_eq!(core, 3, "{e}");
        assert!((timeout..timeout + 10).contains(&waited_ms), "{e}");
        let mut again = w.arena.clone();
        run_semantic_with(&w.table, &mut again.bytes, &kinds, &sched, &options).unwrap();
        assert!(
            again.bytes == clean.bytes,
            "{fault}: the run after it differs"
        );
    }
}
