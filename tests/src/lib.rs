//! Helpers shared by the integration tests in `tests/tests/`: finding the
//! firmware and running a table in QEMU.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

#[path = "../../xtask/src/qemu.rs"]
mod qemu;
#[path = "../../xtask/src/qemu_trace.rs"]
mod qemu_trace;
#[path = "../../xtask/src/target.rs"]
mod target;

pub use qemu::{
    decode_log, launch_block, EventKind, LogLine, QemuError, QemuOutcome, QemuRun, Trace,
    TraceEvent, CPU_MODELS,
};
pub use qemu_trace::{chrome_trace, AICORE_PID, SCHEDULER_PID};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The firmware ELF: `$WSP_FIRMWARE` when set (as `cargo xtask ci` does),
/// otherwise built once per test process into its own target directory, so
/// that the nested cargo does not wait on the lock of the outer one.
pub fn firmware() -> PathBuf {
    static FIRMWARE: OnceLock<PathBuf> = OnceLock::new();
    FIRMWARE
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("WSP_FIRMWARE") {
                return PathBuf::from(path);
            }
            let root = workspace_root();
            let target_dir = root.join("target").join("firmware-for-tests");
            let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cargo
                .current_dir(&root)
                .args(["build", "--release", "-p", "firmware"]);
            let status = target::for_target(&mut cargo)
                .arg("--target-dir")
                .arg(&target_dir)
                .status()
                .expect("running cargo to build the firmware");
            assert!(
                status.success(),
                "building the firmware failed; `cargo xtask setup` installs clang and rust-src"
            );
            target_dir.join(target::TARGET).join("release/firmware")
        })
        .clone()
}

/// The CPU model the QEMU tests run on: `$WSP_QEMU_CPU` when set (one of
/// [`CPU_MODELS`]), otherwise the first of them.
pub fn cpu_model() -> String {
    match std::env::var("WSP_QEMU_CPU") {
        Ok(cpu) => {
            assert!(
                CPU_MODELS.contains(&cpu.as_str()),
                "WSP_QEMU_CPU={cpu}: the QEMU tests run on one of {CPU_MODELS:?}"
            );
            cpu
        }
        Err(_) => CPU_MODELS[0].to_string(),
    }
}

/// Runs workload `w` on the host shim and in QEMU: both must run the
/// workload's tasks, pass its f64 check and write the same arena, bit for
/// bit.
pub fn shim_and_qemu(w: &host_tools::workloads::Workload) {
    let mut shim = w.arena.clone();
    let stats = host_tools::shim::Shim::default()
        .run(&w.table, &mut shim.bytes)
        .unwrap();
    assert_eq!(stats.tasks as usize, w.tasks);
    let outcome = run_in_qemu(&w.table, &w.arena.bytes);
    assert_eq!(
        outcome.status, 0,
        "QEMU run failed:\n{}\n{}",
        outcome.stdout, outcome.stderr
    );
    assert!(
        outcome.stdout.contains(&format!("tasks={} ", w.tasks)),
        "expected {} tasks: {}",
        w.tasks,
        outcome.stdout
    );
    let qemu = host_tools::table::Arena {
        bytes: outcome.arena_out.expect("the firmware writes arena.out"),
    };
    let check = w.verify(&shim);
    assert!(check.passed(), "shim: {check}");
    let check = w.verify(&qemu);
    assert!(check.passed(), "qemu: {check}");
    assert!(shim.bytes == qemu.bytes, "shim and QEMU arenas differ");
}

/// Runs `table` with `arena` in QEMU and captures what the firmware printed
/// and the arena it wrote back.
pub fn run_in_qemu(table: &[u8], arena: &[u8]) -> QemuOutcome {
    run_in_qemu_with(table, arena, None)
}

/// [`run_in_qemu`] with a launch block (see [`launch_block`]).
pub fn run_in_qemu_with(table: &[u8], arena: &[u8], launch: Option<Vec<u8>>) -> QemuOutcome {
    run_in_qemu_configured(table, arena, |run| run.launch = launch)
}

/// [`run_in_qemu`] with the run changed by `configure` first (e.g. its
/// launch block, its CPUs or its CPU model: [`cpu_model`] unless it says
/// otherwise).
pub fn run_in_qemu_configured(
    table: &[u8],
    arena: &[u8],
    configure: impl FnOnce(&mut QemuRun),
) -> QemuOutcome {
    let dir = std::env::temp_dir().join(format!("wsp-tests-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).expect("creating a temporary directory");
    let (table_path, arena_path) = (dir.join("table.bin"), dir.join("arena.bin"));
    std::fs::write(&table_path, table).expect("writing table.bin");
    std::fs::write(&arena_path, arena).expect("writing arena.bin");
    let mut run = QemuRun::new(firmware());
    run.table = Some(table_path);
    run.arena = Some(arena_path);
    run.capture = true;
    run.timeout_secs = 120;
    run.cpu = cpu_model();
    configure(&mut run);
    let outcome = run.run().unwrap_or_else(|e| panic!("QEMU: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
