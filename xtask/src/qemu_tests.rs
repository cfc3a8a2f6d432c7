//! What `cargo xtask qemu` (and every test that runs the firmware through
//! [`QemuRun`]) refuses before QEMU boots: a table file with bytes after
//! its table, and a timeout word of 0 ms.

use std::path::PathBuf;

use host_tools::workloads::{Params, Workload};

use crate::qemu::QemuRun;

/// A fresh directory for one test's files (removed at its end).
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("xtask-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small GEMM's table.
fn gemm_table() -> Vec<u8> {
    let p = Params {
        m: 32,
        n: 32,
        k: 32,
        tile: 32,
        seed: 1,
    };
    Workload::build("gemm", p).unwrap().table
}

/// A run of `table` (written to `dir`); the firmware is any existing file,
/// as `command` only checks that it exists.
fn run_of(dir: &Dir, name: &str, table: &[u8]) -> QemuRun {
    let path = dir.0.join(name);
    std::fs::write(&path, table).unwrap();
    let mut run = QemuRun::new(&path);
    run.table = Some(path);
    run
}

/// A table file with something appended (`cat table.bin garbage >
/// t2.bin`) is refused naming the file, the table's length and the
/// file's, as `wsp run` refuses it; the firmware would read the table and
/// ignore the rest. The table itself, and one cut short (which the
/// firmware names as truncated), make a command.
#[test]
fn a_table_file_with_bytes_after_the_table_is_refused() {
    let dir = Dir::new("a_table_file_with_bytes_after_the_table_is_refused");
    let table = gemm_table();
    let total = table.len();
    let mut appended = table.clone();
    appended.extend_from_slice(b"garbage\n");
    let run = run_of(&dir, "t2.bin", &appended);
    let e = run.command(&dir.0).unwrap_err().to_string();
    let says = format!(
        "t2.bin: invalid descriptor table: section `header`, entry 0, field `total_len`: \
         the table is {total} bytes long, but {} bytes were given: 8 bytes follow it",
        total + 8
    );
    assert!(e.contains(&says), "{e}");
    for (name, bytes) in [("table.bin", &table[..]), ("cut.bin", &table[..total - 1])] {
        let run = run_of(&dir, name, bytes);
        if let Err(e) = run.command(&dir.0) {
            panic!("{name}: {e}");
        }
    }
}

/// `kernel-timeout-ms=0` and `ack-timeout-ms=0` are refused naming the
/// word, with the runtime's reason, before QEMU boots: the firmware took
/// them and refused them only at the run's start, after bringing up its
/// CPUs and loading the table. 1 ms and more pass, and so does a value
/// that is no number, which the firmware names as it reads its words.
#[test]
fn a_timeout_word_of_0_ms_is_refused_before_qemu_starts() {
    let dir = Dir::new("a_timeout_word_of_0_ms_is_refused_before_qemu_starts");
    let run = run_of(&dir, "table.bin", &gemm_table());
    let with = |words: &[&str]| {
        let mut run = run.clone();
        run.args = words.iter().map(|w| w.to_string()).collect();
        run.command(&dir.0).map(drop).map_err(|e| e.to_string())
    };
    let kernel = "kernel-timeout-ms=0: a kernel timeout (kernel_timeout_ms) of 0 ms; \
                  at least 1 ms is needed";
    let ack = "ack-timeout-ms=0: an acknowledgement timeout (ack_timeout_ms) of 0 ms; \
               at least 1 ms is needed";
    for (words, says) in [
        (&["kernel-timeout-ms=0"][..], kernel),
        (
            &[
                "fault=no-ack:0:1",
                "ack-timeout-ms=1500",
                "kernel-timeout-ms=0",
            ],
            kernel,
        ),
        (&["ack-timeout-ms=0"], ack),
        (&["kernel-timeout-ms=4000", "ack-timeout-ms=0"], ack),
    ] {
        let e = with(words).unwrap_err();
        assert!(e.contains(says), "{words:?}: {e}");
    }
    for words in [
        &["kernel-timeout-ms=1", "ack-timeout-ms=1"][..],
        &["kernel-timeout-ms=4000", "ack-timeout-ms=1500"],
        &["kernel-timeout-ms=x"],
        &["empty-kernels", "trace"],
    ] {
        assert_eq!(with(words), Ok(()), "{words:?}");
    }
}
