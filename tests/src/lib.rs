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
    // QEMU's eight vCPU threads share the host's processors: two runs at
    // once on two cores have taken 59 s where one alone took 8.
    run.timeout_secs = 300;
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

/// The AICPU launcher's directory (`wsp-launcher` and `libwsp_aicpu.so`):
/// `$WSP_LAUNCHER` when set (as `cargo xtask ci` does), otherwise built
/// once per test process by `cargo xtask launcher --build-only` in its own
/// target directory, so that the nested cargo does not wait on the lock of
/// the outer one.
pub fn launcher_dir() -> PathBuf {
    static LAUNCHER: OnceLock<PathBuf> = OnceLock::new();
    LAUNCHER
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("WSP_LAUNCHER") {
                return PathBuf::from(path);
            }
            let root = workspace_root();
            let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .current_dir(&root)
                .args(["run", "--quiet", "-p", "xtask", "--", "launcher", "--build-only"])
                .env("CARGO_TARGET_DIR", root.join("target").join("launcher-for-tests"))
                .stderr(std::process::Stdio::inherit())
                .output()
                .expect("running cargo xtask launcher --build-only");
            assert!(
                out.status.success(),
                "building the launcher failed; `cargo xtask setup` installs the aarch64 cross compilers and qemu-user-static"
            );
            let dir = String::from_utf8_lossy(&out.stdout);
            PathBuf::from(dir.lines().last().expect("xtask prints the directory").trim())
        })
        .clone()
}

/// How a launcher run ended.
#[derive(Debug)]
pub struct LauncherOutcome {
    /// The launcher's exit status (0 success, 1 the run failed, 2 bad
    /// input, 3 timed out).
    pub status: i32,
    /// What it printed.
    pub stdout: String,
    /// What it printed to stderr.
    pub stderr: String,
    /// The arena it wrote, after a successful run.
    pub arena_out: Option<Vec<u8>>,
}

/// The AICPU program (`libwsp_aicpu.so`) in the launcher's directory.
pub const AICPU_SO: &str = "libwsp_aicpu.so";
/// The minimal AICPU program (`launcher/fake_aicpu.c`) that tests the
/// launcher on its own.
pub const FAKE_AICPU_SO: &str = "libfake_aicpu.so";

/// Runs `table` with `arena` through the AICPU program `so` (a file name in
/// [`launcher_dir`]: [`AICPU_SO`] or [`FAKE_AICPU_SO`]) and the launcher
/// under qemu-user, with launcher `options` (`--threads N`, `--fault ...`).
pub fn run_in_launcher(so: &str, table: &[u8], arena: &[u8], options: &[&str]) -> LauncherOutcome {
    run_in_launcher_with(so, table, arena, None, options)
}

/// [`run_in_launcher`] with a launch block (see [`launch_block`]), handed
/// to the runtime as it is (`--launch`).
pub fn run_in_launcher_with(
    so: &str,
    table: &[u8],
    arena: &[u8],
    launch: Option<&[u8]>,
    options: &[&str],
) -> LauncherOutcome {
    let dir =
        std::env::temp_dir().join(format!("wsp-launcher-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).expect("creating a temporary directory");
    let (table_path, arena_path, out_path) = (
        dir.join("table.bin"),
        dir.join("arena.bin"),
        dir.join("arena.out"),
    );
    std::fs::write(&table_path, table).expect("writing table.bin");
    std::fs::write(&arena_path, arena).expect("writing arena.bin");
    let launch_path = dir.join("launch.bin");
    let mut launch_option = Vec::new();
    if let Some(block) = launch {
        std::fs::write(&launch_path, block).expect("writing launch.bin");
        launch_option.push("--launch".as_ref());
        launch_option.push(launch_path.as_os_str());
    }
    let launcher = launcher_dir();
    let out = Command::new("timeout")
        .args([
            "--foreground",
            "300",
            "qemu-aarch64-static",
            "-L",
            "/usr/aarch64-linux-gnu",
        ])
        .arg(launcher.join("wsp-launcher"))
        .arg(launcher.join(so))
        .args([&table_path, &arena_path, &out_path])
        .args(options)
        .args(launch_option)
        .output()
        .expect("running qemu-aarch64-static; `cargo xtask setup` installs qemu-user-static");
    let outcome = LauncherOutcome {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        arena_out: std::fs::read(&out_path).ok(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// The arena of a run (in QEMU or through the launcher: `runner`) that
/// ended with status 0, `RESULT OK` and `tasks` tasks; panics naming
/// `what` otherwise. `written` is the arena the run wrote back.
pub fn succeeded(
    runner: &str,
    (status, stdout, stderr): (i32, &str, &str),
    written: &Option<Vec<u8>>,
    tasks: usize,
    what: &str,
) -> Vec<u8> {
    assert_eq!(
        status, 0,
        "{what}: the {runner} run failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("RESULT OK"), "{what}: {stdout}");
    assert!(
        stdout.contains(&format!("tasks={tasks} ")),
        "{what}: expected {tasks} tasks: {stdout}"
    );
    written
        .clone()
        .unwrap_or_else(|| panic!("{what}: the {runner} run wrote no arena"))
}
